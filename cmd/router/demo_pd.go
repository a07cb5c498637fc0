package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/loadgen"
)

// `demo --pd` replays the first policy a second time on the same number of nodes split into a
// prefill pool and a decode pool (docs/disaggregation.md), every engine vLLM with NixlConnector
// as the simulated engine plays it (a KV side channel on loopback, decode legs pulling the
// prefill legs' leased blocks at --sim-kv-transfer-tokens-per-s), the router's front door
// driving both legs, and prints it beside the aggregated run of the same requests.

// pdDisaggregate is the P/D run's --disaggregate: auto, the router's default, so that the run
// shows what an operator gets: a request's prefill goes to a prefill node when the router
// predicts its first token sooner there, transfer included, and stays on the decode node
// otherwise. (always would show the transfer's cost on every request, including those whose
// prefix the decode node already holds.)
const pdDisaggregate = "auto"

// pdRoles splits n nodes (n ≥ 2) into prefill and decode pools: the first half prefill, the
// rest decode (with an odd n the decode pool is the larger: it also serves every request the
// router keeps whole).
func pdRoles(n int) []string {
	roles := make([]string, n)
	for i := range roles {
		roles[i] = "decode"
		if i < n/2 {
			roles[i] = "prefill"
		}
	}
	return roles
}

// pdLegs is what the P/D run's router counted of its prefill legs
// (prefixmesh_frontdoor_prefill_legs_total by outcome).
type pdLegs map[string]float64

// replayPD starts a P/D cluster of cfg.Nodes for policy, replays reqs through its front door and
// reads the router's prefill-leg counts.
func replayPD(ctx context.Context, cfg demoConfig, policy, dir string, reqs []loadgen.Request, logs, stdout io.Writer) (loadgen.Summary, pdLegs, error) {
	cfg.Roles, cfg.Disaggregate = pdRoles(cfg.Nodes), pdDisaggregate
	name := policy + "/pd"
	launched := time.Now()
	c, err := startDemoCluster(ctx, cfg, policy, filepath.Join(dir, policy+"-pd"), logs)
	if err != nil {
		return loadgen.Summary{}, nil, fmt.Errorf("start the P/D cluster: %w", err)
	}
	defer c.stop()
	prefill := 0
	for _, r := range cfg.Roles {
		if r == "prefill" {
			prefill++
		}
	}
	fmt.Fprintf(stdout, "[%s] cluster ready in %.1fs (router %s, %d prefill + %d decode nodes, --disaggregate %s)\n",
		name, time.Since(launched).Seconds(), c.httpAddr, prefill, cfg.Nodes-prefill, cfg.Disaggregate)
	s, err := replay(ctx, cfg, c, name, "http://"+c.httpAddr, reqs, stdout)
	if err != nil {
		return s, nil, err
	}
	fams, err := scrapeMetrics(ctx, http.DefaultClient, "http://"+c.httpAddr+"/metrics")
	if err != nil {
		return s, nil, fmt.Errorf("read the P/D router's metrics: %w", err)
	}
	legs := pdLegs{}
	for _, m := range fams["prefixmesh_frontdoor_prefill_legs_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" {
				legs[l.GetValue()] = value(m)
			}
		}
	}
	return s, legs, nil
}

// writePDTable prints the aggregated run (agg) beside the P/D run of the same requests.
func writePDTable(w io.Writer, policy string, nodes int, agg, pd loadgen.Summary, legs pdLegs) {
	roles := pdRoles(nodes)
	prefill := 0
	for _, r := range roles {
		if r == "prefill" {
			prefill++
		}
	}
	fmt.Fprintf(w, "\nP/D against aggregated (%s, %d nodes: %d both | %d prefill + %d decode, the same %d requests)\n",
		policy, nodes, nodes, prefill, nodes-prefill, agg.Requests)
	names := []string{policy, policy + "/pd"}
	fmt.Fprintf(w, "%-22s%16s%16s\n", "", names[0], names[1])
	row := func(label string, f func(loadgen.Summary) string) {
		fmt.Fprintf(w, "%-22s%16s%16s\n", label, f(agg), f(pd))
	}
	row("requests (errors)", func(s loadgen.Summary) string { return fmt.Sprintf("%d (%d)", s.Requests, s.Errors) })
	row("cached tokens", func(s loadgen.Summary) string { return fmt.Sprintf("%d", s.CachedTokens) })
	row("prefix hit ratio", func(s loadgen.Summary) string { return fmt.Sprintf("%.1f%%", 100*s.HitRatio) })
	row("TTFT mean", func(s loadgen.Summary) string { return ms(s.TTFTMean) })
	row("TTFT p99", func(s loadgen.Summary) string { return ms(s.TTFTP99) })
	row("latency mean", func(s loadgen.Summary) string { return ms(s.LatencyMean) })
	fmt.Fprintf(w, "%-22s%16s%16s\n", "disaggregated", "-", fmt.Sprintf("%.0f of %d", legs["ok"], pd.Requests))
	if n := legs["failed"] + legs["no_kv_transfer_params"]; n > 0 {
		fmt.Fprintf(w, "%-22s%16s%16.0f\n", "prefilled on decode", "-", n)
	}
	if n := legs["refused"] + legs["aborted"]; n > 0 {
		fmt.Fprintf(w, "%-22s%16s%16.0f\n", "prefill leg refused", "-", n)
	}
	fmt.Fprint(w, pdNote)
}

// pdNote says how to read the P/D table.
const pdNote = `cached tokens: what the clients were told, summed; under P/D the prefill leg's cached_tokens, as llm-d's
sidecar reports it (the decode engine counts the KV it pulled as cached). disaggregated: the requests whose
prefill ran on a prefill node and whose KV the decode node pulled (prefixmesh_frontdoor_prefill_legs_total{outcome="ok"});
the others were served whole by a decode node, as --disaggregate auto judged them cheaper there. The simulated
engines run in steps, so a prefill slows the decode steps it shares; but this slice is prefill-heavy (long prompts,
few output tokens): there is little decoding to protect, and the P/D fleet, with half the prefill rate and half
the cache for prompts, shows what the split costs more than what it buys.
`

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
