package loadgen

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/prefixmesh/prefixmesh/routing/sim"
)

// Summary is the aggregate of one replay.
type Summary struct {
	Requests, Errors  int
	PromptTokens      int
	CachedTokens      int
	HitRatio          float64 // cached / prompt tokens over successful requests
	TTFTMean          time.Duration
	TTFTP50, TTFTP99  time.Duration
	LatencyMean       time.Duration
	EstimateExact     float64 // share of routed requests whose estimate equalled cached tokens; -1 if none carried an estimate
	EstimateCompared  int     // requests with both an estimate and the engine's cached-token count
	EstimateMAE       float64 // mean absolute error of the estimate, in tokens
	PerNode           map[string]int
	MaxLate           time.Duration
	FirstErrorMessage string
}

// Summarize aggregates results.
func Summarize(results []Result) Summary {
	s := Summary{Requests: len(results), PerNode: map[string]int{}, EstimateExact: -1}
	var ttfts []time.Duration
	var latSum time.Duration
	var estimated, exact int
	var absErr float64
	for _, r := range results {
		if r.Err != nil {
			s.Errors++
			if s.FirstErrorMessage == "" {
				s.FirstErrorMessage = fmt.Sprintf("%v %s", r.Err, r.ErrorBody)
			}
			continue
		}
		s.PromptTokens += r.Prompt
		s.CachedTokens += r.Cached
		ttfts = append(ttfts, r.TTFT)
		latSum += r.Latency
		s.MaxLate = max(s.MaxLate, r.Late)
		if r.Node != "" {
			s.PerNode[r.Node]++
		}
		if r.Estimate >= 0 && r.HasUsage {
			estimated++
			d := r.Estimate - r.Cached
			if d == 0 {
				exact++
			}
			absErr += float64(max(d, -d))
		}
	}
	if s.PromptTokens > 0 {
		s.HitRatio = float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	if n := len(ttfts); n > 0 {
		slices.Sort(ttfts)
		var sum time.Duration
		for _, t := range ttfts {
			sum += t
		}
		s.TTFTMean = sum / time.Duration(n)
		s.TTFTP50 = sim.Percentile(ttfts, 50)
		s.TTFTP99 = sim.Percentile(ttfts, 99)
		s.LatencyMean = latSum / time.Duration(n)
	}
	s.EstimateCompared = estimated
	if estimated > 0 {
		s.EstimateExact = float64(exact) / float64(estimated)
		s.EstimateMAE = absErr / float64(estimated)
	}
	return s
}

// WriteTable prints summaries side by side, one column per named run.
func WriteTable(w io.Writer, names []string, sums []Summary) {
	fmt.Fprintf(w, "%-22s", "")
	for _, n := range names {
		fmt.Fprintf(w, "%16s", n)
	}
	fmt.Fprintln(w)
	row := func(label string, f func(Summary) string) {
		fmt.Fprintf(w, "%-22s", label)
		for _, s := range sums {
			fmt.Fprintf(w, "%16s", f(s))
		}
		fmt.Fprintln(w)
	}
	row("requests (errors)", func(s Summary) string { return fmt.Sprintf("%d (%d)", s.Requests, s.Errors) })
	row("prefix hit ratio", func(s Summary) string { return fmt.Sprintf("%.1f%%", 100*s.HitRatio) })
	row("TTFT mean", func(s Summary) string { return ms(s.TTFTMean) })
	row("TTFT p50", func(s Summary) string { return ms(s.TTFTP50) })
	row("TTFT p99", func(s Summary) string { return ms(s.TTFTP99) })
	row("latency mean", func(s Summary) string { return ms(s.LatencyMean) })
	row("estimate exact", func(s Summary) string {
		if s.EstimateExact < 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.1f%% of %d", 100*s.EstimateExact, s.EstimateCompared)
	})
	row("estimate MAE (tok)", func(s Summary) string { return fmt.Sprintf("%.1f", s.EstimateMAE) })
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
