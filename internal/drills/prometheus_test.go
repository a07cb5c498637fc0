package drills

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
	"github.com/prefixmesh/prefixmesh/router/extproc/fakegw"
)

// The shipped dashboard and alert rules, relative to this package.
var (
	dashboardFile = filepath.Join("..", "..", "deploy", "helm", "prefixmesh", "files", "dashboards", "prefixmesh.json")
	rulesFile     = filepath.Join("..", "..", "deploy", "helm", "prefixmesh", "files", "alerts", "prefixmesh-rules.yaml")
)

// promWait bounds Prometheus' start, its first scrapes of every target and the scrapes that
// follow the traffic (one a second).
const promWait = 60 * time.Second

// Every panel query of the shipped dashboard and every alert expression's signals return data
// from a real Prometheus scraping a real cluster that has served traffic through its three
// doors: a renamed metric or label fails here, not on an operator's screen. The cluster is two
// routers (Raft, flow control, the endpoint picker on one), two simulated engines publishing vLLM KV events
// and two node agents mirroring them; Prometheus (Debian's package) loads the rules too, and
// every rule must evaluate without error.
func TestDashboardAndAlertsOnPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of processes and Prometheus")
	}
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		testenv.Missing(t, "prometheus", err, "apt-get install prometheus (scripts/test.sh does in CI)")
	}
	panels := dashboardQueries(t)
	f := newFleet(t)
	c := &cluster{fleet: f, nodes: map[string]*proc{}}
	// Flow control on, as its dashboard row and alerts read its series.
	c.routers = append(c.routers, c.launch("router-0", c.rtrBin, append(c.routerArgs(0), "--ext-proc-listen=127.0.0.1:0", "--flow-control")...))
	c.routers = append(c.routers, c.launch("router-1", c.rtrBin, append(c.routerArgs(1), "--flow-control")...))
	for _, r := range c.routers {
		c.routerCCs = append(c.routerCCs, dial(t, r.addrs["grpc"]))
	}
	var engines []*proc
	for i := range 2 {
		id := fmt.Sprintf("node-%d", i)
		eng := f.launch(id+"-engine", f.nodeBin, "--node-id="+id+"-engine", "--engine=sim", "--log-level=info",
			"--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
			"--sim-kv-events=tcp://127.0.0.1:0", "--sim-kv-events-replay=tcp://127.0.0.1:0",
			"--block-size=16", "--kv-blocks=4096", "--sim-prefill-tokens-per-s=2e6", "--sim-decode-tokens-per-s=2000",
			"--drain-timeout=5s")
		engines = append(engines, eng)
		c.nodes[id] = f.launch(id, f.nodeBin, "--node-id="+id, "--engine=vllm", "--log-level=info",
			"--engine-url=http://"+eng.addrs["http"], "--kv-events="+eng.addrs["kvevents"], "--kv-events-replay="+eng.addrs["kvevents_replay"],
			"--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--gossip-listen=127.0.0.1:0",
			"--gossip-key-file="+f.key, "--join="+c.routers[0].addrs["gossip"], "--block-size=16", "--drain-timeout=5s")
	}
	// A node agent whose engine is the built-in simulated one: the cache's own series and the
	// pin follower (a mirrored engine's agent holds no prefix pins).
	c.startNode("node-2", anyPort)
	for i := range c.routers {
		eventually(t, startWait, fmt.Sprintf("router-%d routes among 3 nodes", i), func() error { return c.candidatesAre(i, 3) })
	}

	prom := startPrometheus(t, f, promBin, map[string][]*proc{
		"prefixmesh-router": c.routers, "prefixmesh-node": {c.nodes["node-0"], c.nodes["node-1"], c.nodes["node-2"]},
		"prefixmesh-engine": engines,
	})
	eventually(t, promWait, "Prometheus scrapes every target", func() error {
		return prom.expect(`count(up == 1)`, 7)
	})

	sendTraffic(t, c)
	// A series the traffic created must be in two scrapes for a rate to see it: wait until
	// every target's last scrape began two intervals after the traffic ended.
	after := float64(time.Now().Add(2*time.Second).UnixMilli()) / 1000
	eventually(t, promWait, "two scrapes of every target after the traffic", func() error {
		return prom.expect(fmt.Sprintf(`count(timestamp(up) > %.3f)`, after), 7)
	})

	checkStatus(t, c)

	var missing []string
	for _, p := range panels {
		if err := prom.hasData(p.expr); err != nil {
			missing = append(missing, fmt.Sprintf("panel %q: %s: %v", p.title, p.expr, err))
		}
	}
	rules := prom.rules(t)
	if len(rules) == 0 {
		t.Fatal("Prometheus loaded no rules from " + rulesFile)
	}
	alerts := 0
	for _, r := range rules {
		if r.Type == "alerting" {
			alerts++
		}
		for _, q := range signals(r.Query) {
			if err := prom.hasData(q); err != nil {
				missing = append(missing, fmt.Sprintf("alert %s: %s: %v", r.Name, q, err))
			}
		}
	}
	// Rules are evaluated once a second: wait for every rule's first evaluation.
	eventually(t, promWait, "every rule evaluated without error", func() error {
		for _, r := range prom.rules(t) {
			if r.Health != "ok" {
				return fmt.Errorf("rule %s: health %q %s", r.Name, r.Health, r.LastError)
			}
		}
		return nil
	})
	if len(missing) > 0 {
		t.Fatalf("%d of %d queries return no data:\n%s", len(missing), len(panels)+len(rules), strings.Join(missing, "\n"))
	}
	t.Logf("%d panel queries and %d rules (%d alerts) return data", len(panels), len(rules), alerts)
	for _, r := range prom.rules(t) {
		if r.State == "firing" {
			t.Logf("firing in the test cluster: %s", r.Name)
		}
	}
}

// panelQuery is one target of a dashboard panel.
type panelQuery struct{ title, expr string }

// gridVars are the Grafana variables panel queries may use, with the values the test gives them.
var gridVars = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "15s")

// dashboardQueries reads every panel's targets, rows' nested panels included.
func dashboardQueries(t *testing.T) []panelQuery {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string  `json:"title"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []panelQuery
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				expr := gridVars.Replace(tg.Expr)
				if strings.Contains(expr, "$") {
					t.Fatalf("panel %q uses a template variable the test cannot fill: %s", p.Title, tg.Expr)
				}
				out = append(out, panelQuery{p.Title, expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if len(out) == 0 {
		t.Fatalf("%s: no panel queries", dashboardFile)
	}
	return out
}

// sendTraffic sends requests through the three doors: the HTTP front door (streamed and not,
// four shared prefixes so that later requests hit the cache, and one malformed request),
// gRPC Route, and the endpoint picker behind a fake gateway.
func sendTraffic(t *testing.T, c *cluster) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	prompt := func(i int) []int {
		toks := make([]int, 0, 160)
		for j := range 128 { // the shared prefix: 8 blocks
			toks = append(toks, 1000*(i%4+1)+j)
		}
		for j := range 32 {
			toks = append(toks, 100000+1000*i+j)
		}
		return toks
	}
	post := func(base string, body any) (int, string) {
		b, _ := json.Marshal(body)
		resp, err := client.Post(base+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatalf("POST %s: %v", base, err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(out)
	}
	front := "http://" + c.routers[0].addrs["http"]
	for i := range 16 {
		if code, body := post(front, map[string]any{"model": "prefixmesh-sim", "prompt": prompt(i), "max_tokens": 4, "stream": i%2 == 0}); code != 200 {
			t.Fatalf("front door request %d: %d %s", i, code, body)
		}
	}
	if code, _ := post(front, map[string]any{"model": "prefixmesh-sim", "prompt": []any{"not", 1, "token"}}); code/100 != 4 {
		t.Fatalf("a malformed prompt answered %d, want a 4xx", code)
	}
	for i := range 4 {
		toks := make([]uint32, 0, 160)
		for _, v := range prompt(i) {
			toks = append(toks, uint32(v))
		}
		if _, err := c.route(1, toks); err != nil {
			t.Fatalf("Route: %v", err)
		}
	}
	gw := fakegw.New(extprocv3.NewExternalProcessorClient(dial(t, c.routers[0].addrs["extproc"])), fakegw.Config{
		RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	for i := range 6 {
		if code, body := post("http://"+ln.Addr().String(), map[string]any{"model": "prefixmesh-sim", "prompt": prompt(i), "max_tokens": 4, "stream": i%2 == 1}); code != 200 {
			t.Fatalf("gateway request %d: %d %s", i, code, body)
		}
	}
}

// promServer is a Prometheus process and its HTTP API.
type promServer struct {
	base   string
	client *http.Client
}

// startPrometheus runs Prometheus scraping each job's processes' /metrics every second, with the
// shipped rules, on a port picked free just before (Prometheus cannot report a port it chose;
// a port taken in between fails the start, and the test says so).
func startPrometheus(t *testing.T, f *fleet, bin string, jobs map[string][]*proc) *promServer {
	t.Helper()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n", rules)
	for job, procs := range jobs {
		fmt.Fprintf(&cfg, "  - job_name: %q\n    static_configs:\n      - targets:\n", job)
		for _, p := range procs {
			fmt.Fprintf(&cfg, "          - %q\n", p.addrs["http"])
		}
	}
	dir := filepath.Join(f.dir, "prometheus")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(exitWait):
			t.Errorf("prometheus not reaped within %v of SIGKILL", exitWait)
		}
	})
	p := &promServer{base: "http://" + addr, client: &http.Client{Timeout: 10 * time.Second}}
	eventually(t, promWait, "Prometheus ready", func() error {
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Fatalf("prometheus exited:\n%s", b)
		default:
		}
		code, _, err := httpGet(p.base + "/-/ready")
		if err != nil || code != 200 {
			return fmt.Errorf("/-/ready %d %v", code, err)
		}
		return nil
	})
	return p
}

// apiResult is the part of a Prometheus API answer the test reads.
type apiResult struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
		Groups     []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	} `json:"data"`
}

type promRule struct {
	Name      string `json:"name"`
	Query     string `json:"query"`
	Type      string `json:"type"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	State     string `json:"state"`
}

func (p *promServer) get(path string, q url.Values) (*apiResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r apiResult
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", path, r.Error)
	}
	return &r, nil
}

// hasData runs an instant query and fails when it errs or returns no sample.
func (p *promServer) hasData(query string) error {
	r, err := p.get("/api/v1/query", url.Values{"query": {query}})
	if err != nil {
		return err
	}
	if r.Data.ResultType == "scalar" || len(r.Data.Result) > 0 {
		return nil
	}
	return fmt.Errorf("no data")
}

// sampleValue reads the value of a vector sample: {"metric":…, "value":[ts, "v"]}.
var sampleValue = regexp.MustCompile(`"value":\[[0-9.e+]+,"([^"]*)"\]`)

// expect fails unless query returns exactly one sample with value want.
func (p *promServer) expect(query string, want float64) error {
	r, err := p.get("/api/v1/query", url.Values{"query": {query}})
	if err != nil {
		return err
	}
	if len(r.Data.Result) != 1 {
		return fmt.Errorf("%s: %d samples", query, len(r.Data.Result))
	}
	m := sampleValue.FindSubmatch(r.Data.Result[0])
	if m == nil || string(m[1]) != fmt.Sprint(want) {
		return fmt.Errorf("%s = %s, want %v", query, r.Data.Result[0], want)
	}
	return nil
}

func (p *promServer) rules(t *testing.T) []promRule {
	t.Helper()
	r, err := p.get("/api/v1/rules", nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []promRule
	for _, g := range r.Data.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// checkStatus runs `prefixmesh-router status` against router-0, which routed every front-door
// request: it lists the three nodes, synced and routable, and the front door's closed loop.
func checkStatus(t *testing.T, c *cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startWait)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.rtrBin, "status", "--addr", c.routers[0].addrs["http"]).CombinedOutput()
	if err != nil {
		t.Fatalf("prefixmesh-router status: %v\n%s", err, out)
	}
	text := string(out)
	// 22 requests were routed here; the Route calls that waited for the nodes count too.
	m := regexp.MustCompile(`decisions since start: (\d+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("status prints no decision count:\n%s", text)
	}
	if n, _ := strconv.Atoi(m[1]); n < 22 {
		t.Fatalf("status counts fewer decisions than the 22 routed:\n%s", text)
	}
	for _, want := range []string{"3 nodes mirrored, 3 synced", "Raft leader: this router",
		"front door: estimate == cached_tokens", "endpoint picker: estimate == cached_tokens", "ALL BLOCKS"} {
		if !strings.Contains(text, want) {
			t.Fatalf("status lacks %q:\n%s", want, text)
		}
	}
	for _, id := range []string{"node-0", "node-1", "node-2"} {
		if !regexp.MustCompile(`(?m)^` + id + ` +prefixmesh-sim +both +ok `).MatchString(text) { // role: the default
			t.Fatalf("status shows %s not ok:\n%s", id, text)
		}
	}
	t.Logf("prefixmesh-router status:\n%s", text)
}
