package simengine

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node/kvevents"
)

// legLog records the engine's "request done" lines, so that a test can see from the engine's
// side which leg each request served.
type legLog struct {
	mu   sync.Mutex
	legs []string
}

func (l *legLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *legLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *legLog) WithGroup(string) slog.Handler            { return l }
func (l *legLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "request done" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "leg" {
			l.mu.Lock()
			l.legs = append(l.legs, a.Value.String())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *legLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.legs...)
}

// fakeClock is the lease clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// pdEngine is a test engine with its leg log and, when given, a lease clock.
type pdEngine struct {
	*testEngine
	legs  *legLog
	clock *fakeClock
}

// startPD starts an engine like startEngine, recording its legs, with the lease clock clk when
// not nil (set before Start, so the lease loop never sees it change).
func startPD(t *testing.T, cfg Config, clk *fakeClock) *pdEngine {
	t.Helper()
	cache := local.NewRadixTree(local.Options{})
	reg := prometheus.NewRegistry()
	legs := &legLog{}
	e, err := New(cfg, cache, slog.New(legs), reg)
	if err != nil {
		t.Fatal(err)
	}
	if clk != nil {
		e.now = clk.Now
	}
	if err := e.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(e.Close)
	return &pdEngine{testEngine: &testEngine{Engine: e, srv: srv, cache: cache, reg: reg}, legs: legs, clock: clk}
}

// kick wakes the lease loop, as adding a lease does.
func (pe *pdEngine) kick() {
	select {
	case pe.leaseKick <- struct{}{}:
	default:
	}
}

// metricValue is a counter's or a gauge's value (0 when the series does not exist).
func metricValue(t *testing.T, te *testEngine, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := te.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// toyPrefill is the prefill leg's body as vLLM's toy proxy sends it
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, send_request_to_service): the
// client's body with these kv_transfer_params, stream false, max_tokens 1, stream_options and
// min_tokens removed.
func toyPrefill(client map[string]any) map[string]any {
	p := map[string]any{}
	for k, v := range client {
		p[k] = v
	}
	p["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	p["stream"], p["max_tokens"] = false, 1
	if _, ok := p["max_completion_tokens"]; ok {
		p["max_completion_tokens"] = 1
	}
	delete(p, "stream_options")
	delete(p, "min_tokens")
	delete(p, "min_completion_tokens")
	return p
}

// toyDecode is the decode leg's body: the client's body with the prefill response's
// kv_transfer_params copied unchanged, as the toy proxy forwards them.
func toyDecode(client map[string]any, params json.RawMessage) map[string]any {
	d := map[string]any{}
	for k, v := range client {
		d[k] = v
	}
	if len(params) > 0 && string(params) != "null" {
		d["kv_transfer_params"] = params
	}
	return d
}

// prefillLeg runs a prefill leg on te and returns its raw kv_transfer_params and the response:
// a chat leg when the client body has messages, else a completion.
func prefillLeg(t *testing.T, te *pdEngine, client map[string]any) (json.RawMessage, map[string]json.RawMessage) {
	t.Helper()
	path := "/v1/completions"
	if _, ok := client["messages"]; ok {
		path = "/v1/chat/completions"
	}
	resp, b := te.post(t, path, toyPrefill(client))
	if resp.StatusCode != 200 {
		t.Fatalf("prefill leg: %d %s", resp.StatusCode, b)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	return top["kv_transfer_params"], top
}

// follow mirrors te's KV events with the node agent's real follower, as the kvevents tests do.
func follow(t *testing.T, te *pdEngine, bs int) *kvevents.CacheMirror {
	t.Helper()
	mir := kvevents.NewCacheMirror(bs)
	fc := kvevents.DefaultConfig()
	fc.Endpoint, fc.Replay = te.KVEventsAddr(), te.KVEventsReplayAddr()
	f, err := kvevents.NewFollower(fc, mir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx)
	t.Cleanup(func() { cancel(); f.Close() })
	return mir
}

// checkNoLeases verifies that te holds no lease and that, its requests done, every block comes
// back (checkDrained): the pool is back to its baseline.
func (pe *pdEngine) checkNoLeases(t *testing.T) {
	t.Helper()
	eventually(t, "every lease and request to end", func() bool {
		return pe.Leases() == 0 && pe.Load().Running == 0 && pe.PoolStats().Running == 0
	})
	pe.checkDrained(t)
}

// checkReleased verifies, without evicting the cache, that te holds no lease and that no
// sequence holds blocks any more (a lease's sequence finished): what is still allocated is what
// the cache keeps, as after whole requests. checkNoLeases also evicts everything to prove it.
func (pe *pdEngine) checkReleased(t *testing.T) {
	t.Helper()
	eventually(t, "every lease and request to end", func() bool {
		return pe.Leases() == 0 && pe.Load().Running == 0 && pe.PoolStats().Running == 0
	})
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if st := pe.pool.Stats(); st.Running != 0 || st.Violations != 0 {
		t.Fatalf("pool %+v: sequences still hold blocks", st)
	}
	if err := pe.pool.Check(); err != nil {
		t.Fatal(err)
	}
}
