package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/prefixmesh/prefixmesh/internal/tlsfiles"
)

const statusUsage = `usage: prefixmesh-router status [--addr host:port|URL] [--json] [--timeout d] [--tls-ca f [--tls-cert f --tls-key f]]

Prints what one router sees of the fleet, read from its /metrics (serve --http-listen, or
--metrics-listen when set): every node it mirrors with its model, serving role (prefill,
decode or both, with its KV connector when one is set), state (synced, draining, cold, ejected), KV blocks per tier in the router's index, load as the node last reported it,
this router's requests in flight, the learned prefill speed and the age of the node's last
report; above the table, gossip and Raft membership, the decisions' estimated hit ratio against
a cache-blind choice and the engines' observed one, estimate accuracy per door, and TTFT
observed against predicted. Exit status: 0 ok, 1 the router could not be read, 2 usage.
`

// statusMaxBytes bounds the /metrics page read: a router's page is a few hundred KiB even with
// a thousand nodes (about 20 series per node); 64 MiB is far beyond that, and stops a wrong
// address that streams forever.
const statusMaxBytes = 64 << 20

// runStatus is the "status" subcommand.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("addr", "127.0.0.1:8081", "the router's HTTP address (serve --http-listen, or --metrics-listen): host:port or a URL")
	asJSON := fs.Bool("json", false, "print JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline of the request")
	ca := fs.String("tls-ca", "", "CA bundle to verify the router's HTTPS certificate with (https URLs)")
	cert := fs.String("tls-cert", "", "client certificate, when the router requires one (--http-tls-client-ca)")
	key := fs.String("tls-key", "", "client key")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, statusUsage)
			return 0
		}
		if err == nil {
			err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
		}
		fmt.Fprintf(stderr, "router status: %v\n%s", err, statusUsage)
		return 2
	}
	url := *addr
	if !strings.Contains(url, "://") {
		url = "http://" + url
		if *ca != "" {
			url = "https://" + *addr
		}
	}
	url = strings.TrimSuffix(url, "/") + "/metrics"
	client := &http.Client{Timeout: *timeout}
	if strings.HasPrefix(url, "https://") || *cert != "" {
		tc, err := tlsfiles.Client(*cert, *key, *ca)
		if err != nil {
			fmt.Fprintf(stderr, "router status: %v\n", err)
			return 2
		}
		client.Transport = &http.Transport{TLSClientConfig: tc}
	}
	fams, err := scrapeMetrics(ctx, client, url)
	if err != nil {
		fmt.Fprintf(stderr, "router status: %v\n", err)
		return 1
	}
	st := buildStatus(fams)
	st.Router.Addr = *addr
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			fmt.Fprintf(stderr, "router status: %v\n", err)
			return 1
		}
		return 0
	}
	st.print(stdout)
	return 0
}

// scrapeMetrics reads and parses a router's Prometheus text page.
func scrapeMetrics(ctx context.Context, client *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s (is this the router's --http-listen, or its --metrics-listen when set?)", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, statusMaxBytes))
	if err != nil {
		return nil, fmt.Errorf("GET %s: not a Prometheus text page: %w", url, err)
	}
	if _, ok := fams["prefixmesh_router_node_info"]; !ok {
		if _, ok := fams["prefixmesh_router_decided_requests_total"]; !ok {
			return nil, fmt.Errorf("GET %s: no prefixmesh router series (a node agent's or another program's page?)", url)
		}
	}
	return fams, nil
}

// fleetStatus is what `status` prints; its JSON form is the --json output.
type fleetStatus struct {
	Router routerStatus `json:"router"`
	Nodes  []nodeStatus `json:"nodes"`
}

type routerStatus struct {
	Addr string `json:"addr"`
	// GossipMembers are the live members this router knows, by role, itself included.
	GossipMembers map[string]int `json:"gossip_members,omitempty"`
	// RaftLeader is whether this router leads the pin store (absent: it runs no voter).
	RaftLeader *bool   `json:"raft_leader,omitempty"`
	Decisions  float64 `json:"decisions"`
	// Hit ratios since the router started: the decisions' estimated reuse on the chosen node,
	// what a cache-blind choice among the same candidates would reuse, and what the engines
	// reported (cached_tokens) over the prompts they were compared on.
	EstimatedHitRatio  *float64            `json:"estimated_hit_ratio,omitempty"`
	CacheBlindHitRatio *float64            `json:"cache_blind_hit_ratio,omitempty"`
	ObservedHitRatio   *float64            `json:"observed_hit_ratio,omitempty"`
	Accuracy           map[string]accuracy `json:"estimate_accuracy,omitempty"` // by door
	TTFT               map[string]ttftPair `json:"ttft,omitempty"`              // by door
}

// accuracy is one door's share of requests whose estimate equalled the engine's cached_tokens.
type accuracy struct {
	Exact    float64 `json:"exact"`
	Compared float64 `json:"compared"`
}

// ttftPair holds quantiles (seconds) of one door's observed and predicted TTFT since start.
type ttftPair struct {
	ObservedP50  float64 `json:"observed_p50_s"`
	ObservedP99  float64 `json:"observed_p99_s"`
	PredictedP50 float64 `json:"predicted_p50_s"`
	PredictedP99 float64 `json:"predicted_p99_s"`
	Count        float64 `json:"count"`
}

type nodeStatus struct {
	Node  string `json:"node"`
	Model string `json:"model"`
	// Role and KVConnector are the node's serving role and KV connector as it gossips them;
	// empty when the router predates roles (its node_info has no such labels).
	Role        string   `json:"role,omitempty"`
	KVConnector string   `json:"kv_connector,omitempty"`
	State       []string `json:"state"` // empty: routable
	// Blocks are the KV blocks the router's index holds for the node, by tier.
	Blocks              map[string]float64 `json:"blocks"`
	KVCapacity          float64            `json:"kv_capacity_blocks"`
	FreeBlocks          float64            `json:"free_blocks"`
	Running             float64            `json:"running"`
	Waiting             float64            `json:"waiting"`
	QueuedPrefillTokens float64            `json:"queued_prefill_tokens"`
	InFlight            float64            `json:"inflight"`
	TTFTScale           *float64           `json:"ttft_scale,omitempty"`
	ReportAgeSeconds    *float64           `json:"report_age_s,omitempty"`
}

// doors are the subsystems whose closed loop the router records, in print order.
var doors = []struct{ subsystem, name string }{{"frontdoor", "front door"}, {"extproc", "endpoint picker"}}

func buildStatus(fams map[string]*dto.MetricFamily) fleetStatus {
	var st fleetStatus
	byNode := map[string]*nodeStatus{}
	for _, m := range fams["prefixmesh_router_node_info"].GetMetric() {
		id := label(m, "node")
		st.Nodes = append(st.Nodes, nodeStatus{Node: id, Model: label(m, "model"), Role: label(m, "role"), KVConnector: label(m, "kv_connector"),
			State: []string{}, Blocks: map[string]float64{}})
	}
	slices.SortFunc(st.Nodes, func(a, b nodeStatus) int { return strings.Compare(a.Node, b.Node) })
	for i := range st.Nodes {
		byNode[st.Nodes[i].Node] = &st.Nodes[i]
	}
	perNode := func(name string, set func(n *nodeStatus, m *dto.Metric, v float64)) {
		for _, m := range fams[name].GetMetric() {
			if n := byNode[label(m, "node")]; n != nil {
				set(n, m, value(m))
			}
		}
	}
	perNode("prefixmesh_router_node_blocks", func(n *nodeStatus, m *dto.Metric, v float64) { n.Blocks[label(m, "tier")] = v })
	perNode("prefixmesh_router_node_kv_capacity_blocks", func(n *nodeStatus, _ *dto.Metric, v float64) { n.KVCapacity = v })
	perNode("prefixmesh_router_node_free_blocks", func(n *nodeStatus, _ *dto.Metric, v float64) { n.FreeBlocks = v })
	perNode("prefixmesh_router_node_running", func(n *nodeStatus, _ *dto.Metric, v float64) { n.Running = v })
	perNode("prefixmesh_router_node_waiting", func(n *nodeStatus, _ *dto.Metric, v float64) { n.Waiting = v })
	perNode("prefixmesh_router_node_queued_prefill_tokens", func(n *nodeStatus, _ *dto.Metric, v float64) { n.QueuedPrefillTokens = v })
	perNode("prefixmesh_router_node_inflight", func(n *nodeStatus, _ *dto.Metric, v float64) { n.InFlight = v })
	perNode("prefixmesh_router_node_report_age_seconds", func(n *nodeStatus, _ *dto.Metric, v float64) { n.ReportAgeSeconds = &v })
	perNode("prefixmesh_router_ttft_fit_scale", func(n *nodeStatus, _ *dto.Metric, v float64) { n.TTFTScale = &v })
	perNode("prefixmesh_router_node_synced", func(n *nodeStatus, _ *dto.Metric, v float64) {
		if v == 0 {
			n.State = append(n.State, "unsynced")
		}
	})
	for _, flag := range []string{"draining", "cold", "ejected"} {
		perNode("prefixmesh_router_node_"+flag, func(n *nodeStatus, _ *dto.Metric, v float64) {
			if v != 0 {
				n.State = append(n.State, flag)
			}
		})
	}

	r := &st.Router
	for _, m := range fams["prefixmesh_gossip_members"].GetMetric() {
		if r.GossipMembers == nil {
			r.GossipMembers = map[string]int{}
		}
		r.GossipMembers[label(m, "role")] = int(value(m))
	}
	if f := fams["prefixmesh_pins_is_leader"]; len(f.GetMetric()) > 0 {
		leads := value(f.GetMetric()[0]) == 1
		r.RaftLeader = &leads
	}
	r.Decisions = single(fams, "prefixmesh_router_decided_requests_total")
	if prompt := single(fams, "prefixmesh_router_decided_prompt_tokens_total"); prompt > 0 {
		r.EstimatedHitRatio = ratio(single(fams, "prefixmesh_router_decided_matched_tokens_total"), prompt)
		r.CacheBlindHitRatio = ratio(single(fams, "prefixmesh_router_decided_uniform_matched_tokens_total"), prompt)
	}
	var cached, prompt float64
	for _, d := range doors {
		p := "prefixmesh_" + d.subsystem + "_"
		cached += single(fams, p+"engine_cached_tokens_total")
		prompt += single(fams, p+"engine_prompt_tokens_total")
		if _, ok := fams[p+"estimate_compared_total"]; ok {
			if r.Accuracy == nil {
				r.Accuracy = map[string]accuracy{}
			}
			r.Accuracy[d.subsystem] = accuracy{Exact: single(fams, p+"estimate_exact_total"), Compared: single(fams, p+"estimate_compared_total")}
		}
		obs, pred := fams[p+"ttft_seconds"], fams[p+"predicted_ttft_seconds"]
		if h := firstHistogram(obs); h != nil && h.GetSampleCount() > 0 {
			if r.TTFT == nil {
				r.TTFT = map[string]ttftPair{}
			}
			tp := ttftPair{Count: float64(h.GetSampleCount()), ObservedP50: quantile(h, 0.5), ObservedP99: quantile(h, 0.99)}
			if ph := firstHistogram(pred); ph != nil && ph.GetSampleCount() > 0 {
				tp.PredictedP50, tp.PredictedP99 = quantile(ph, 0.5), quantile(ph, 0.99)
			}
			r.TTFT[d.subsystem] = tp
		}
	}
	if prompt > 0 {
		r.ObservedHitRatio = ratio(cached, prompt)
	}
	return st
}

func (st *fleetStatus) print(w io.Writer) {
	r := &st.Router
	synced := 0
	for _, n := range st.Nodes {
		if !slices.Contains(n.State, "unsynced") {
			synced++
		}
	}
	fmt.Fprintf(w, "router %s: %d nodes mirrored, %d synced", r.Addr, len(st.Nodes), synced)
	if len(r.GossipMembers) > 0 {
		roles := make([]string, 0, len(r.GossipMembers))
		for role := range r.GossipMembers {
			roles = append(roles, role)
		}
		slices.Sort(roles)
		for i, role := range roles {
			roles[i] = fmt.Sprintf("%d %s", r.GossipMembers[role], role)
		}
		fmt.Fprintf(w, "; gossip members: %s", strings.Join(roles, ", "))
	}
	if r.RaftLeader != nil {
		fmt.Fprintf(w, "; Raft leader: %s", map[bool]string{true: "this router", false: "another router"}[*r.RaftLeader])
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "decisions since start: %.0f", r.Decisions)
	if r.EstimatedHitRatio != nil {
		fmt.Fprintf(w, "; estimated hit ratio %s (a cache-blind choice: %s)", pct(r.EstimatedHitRatio), pct(r.CacheBlindHitRatio))
	}
	if r.ObservedHitRatio != nil {
		fmt.Fprintf(w, "; engines observed %s", pct(r.ObservedHitRatio))
	}
	fmt.Fprintln(w)
	for _, d := range doors {
		a, ok := r.Accuracy[d.subsystem]
		t, tok := r.TTFT[d.subsystem]
		if !ok && !tok {
			continue
		}
		fmt.Fprintf(w, "%s:", d.name)
		if ok && a.Compared > 0 {
			fmt.Fprintf(w, " estimate == cached_tokens %s of %.0f;", pct(ratio(a.Exact, a.Compared)), a.Compared)
		}
		if tok {
			fmt.Fprintf(w, " TTFT p50 %s p99 %s observed, %s %s predicted (%.0f requests)", secs(t.ObservedP50), secs(t.ObservedP99),
				secs(t.PredictedP50), secs(t.PredictedP99), t.Count)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	var tiers []string
	for _, n := range st.Nodes {
		for tier := range n.Blocks {
			if !slices.Contains(tiers, tier) {
				tiers = append(tiers, tier)
			}
		}
	}
	slices.Sort(tiers)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := []string{"NODE", "MODEL", "ROLE", "STATE"}
	for _, tier := range tiers {
		header = append(header, strings.ToUpper(tier)+" BLOCKS")
	}
	header = append(header, "CAPACITY", "FREE", "RUNNING", "WAITING", "QUEUED PREFILL", "IN FLIGHT", "TTFT SCALE", "REPORT AGE")
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, n := range st.Nodes {
		state := "ok"
		if len(n.State) > 0 {
			state = strings.Join(n.State, ",")
		}
		row := []string{n.Node, n.Model, n.roleCell(), state}
		for _, tier := range tiers {
			if v, ok := n.Blocks[tier]; ok {
				row = append(row, num(v))
			} else {
				row = append(row, "-")
			}
		}
		scale, age := "-", "-"
		if n.TTFTScale != nil {
			scale = strconv.FormatFloat(*n.TTFTScale, 'f', 2, 64)
		}
		if n.ReportAgeSeconds != nil {
			age = secs(*n.ReportAgeSeconds)
		}
		capacity := "-" // a mirrored engine's agent does not know its engine's pool size
		if n.KVCapacity > 0 {
			capacity = num(n.KVCapacity)
		}
		row = append(row, capacity, num(n.FreeBlocks), num(n.Running), num(n.Waiting), num(n.QueuedPrefillTokens),
			num(n.InFlight), scale, age)
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	_ = tw.Flush()
}

// roleCell is the ROLE column: the role, then the KV connector when one is configured (which
// pools can hand KV to each other), or "-" from a router that predates roles.
func (n nodeStatus) roleCell() string {
	switch {
	case n.Role == "":
		return "-"
	case n.KVConnector == "" || n.KVConnector == "none":
		return n.Role
	default:
		return n.Role + "/" + n.KVConnector
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return math.NaN()
}

// single is the value of an unlabelled series, 0 when absent.
func single(fams map[string]*dto.MetricFamily, name string) float64 {
	if ms := fams[name].GetMetric(); len(ms) > 0 {
		return value(ms[0])
	}
	return 0
}

func firstHistogram(f *dto.MetricFamily) *dto.Histogram {
	if ms := f.GetMetric(); len(ms) > 0 {
		return ms[0].GetHistogram()
	}
	return nil
}

// quantile estimates the q-quantile of a cumulative histogram as Prometheus' histogram_quantile
// does: linear interpolation inside the bucket that holds the rank, the lower bound of the first
// bucket taken as 0, and the highest finite bound when the rank falls in the +Inf bucket.
func quantile(h *dto.Histogram, q float64) float64 {
	total := float64(h.GetSampleCount())
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range h.GetBucket() {
		upper, count := b.GetUpperBound(), float64(b.GetCumulativeCount())
		if count >= rank {
			if math.IsInf(upper, 1) {
				return lower
			}
			if count == below {
				return upper
			}
			return lower + (upper-lower)*(rank-below)/(count-below)
		}
		lower, below = upper, count
	}
	return lower // the rank is in the implicit +Inf bucket
}

func ratio(a, b float64) *float64 {
	if b == 0 {
		return nil
	}
	r := a / b
	return &r
}

func pct(p *float64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatFloat(100**p, 'f', 1, 64) + "%"
}

func secs(s float64) string {
	if math.IsNaN(s) {
		return "-"
	}
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
