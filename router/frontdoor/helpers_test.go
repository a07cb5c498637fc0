package frontdoor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node/simengine"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

const simModel = "prefixmesh-sim"

// fastEngineConfig makes simulated time negligible; the tokenizer is the router's default.
func fastEngineConfig() simengine.Config {
	cfg := simengine.DefaultConfig()
	cfg.KVBlocks = 8192
	cfg.PrefillTokensPerSec = 1e9
	cfg.DecodeTokensPerSec = 1e9
	return cfg
}

// simNode is a simulated engine with a real radix tree, served on 127.0.0.1:0.
type simNode struct {
	id    string
	eng   *simengine.Engine
	tree  *local.RadixTree
	srv   *httptest.Server
	epoch uint64
	seq   uint64 // journal position the test index has applied
	dead  bool
}

func startSimNode(t *testing.T, id string, cfg simengine.Config) *simNode {
	t.Helper()
	tree := local.NewRadixTree(local.Options{})
	eng, err := simengine.New(cfg, tree, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(t.Context())
	srv := httptest.NewServer(eng.Handler())
	n := &simNode{id: id, eng: eng, tree: tree, srv: srv, epoch: uint64(len(id)) + 1}
	t.Cleanup(func() { n.kill() })
	return n
}

// kill stops the engine and its listener: later connects are refused.
func (n *simNode) kill() {
	n.eng.Close()
	n.srv.CloseClientConnections()
	n.srv.Close()
	n.dead = true
}

// nodeList is a NodeSource the test can change.
type nodeList struct {
	mu    sync.Mutex // guards nodes
	nodes []requests.NodeTarget
}

func (l *nodeList) Nodes() []requests.NodeTarget {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nodes
}

func (l *nodeList) set(nodes []requests.NodeTarget) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nodes = nodes
}

func target(id, url string) requests.NodeTarget {
	return requests.NodeTarget{Info: routing.NodeInfo{ID: id, Alive: true, Model: simModel, BlockSize: 16}, EngineURL: url}
}

// fleet is a front door over simulated engines, through a request service with a PolicyPicker
// fed from their journals.
type fleet struct {
	nodes  []*simNode
	list   *nodeList
	index  *routing.Index
	picker *requests.PolicyPicker
	health *requests.Health
	tap    *healthTap // the service's health reports, counted on their way to health
	svc    *requests.Service
	fd     *Server
	srv    *httptest.Server
	reg    *prometheus.Registry
	logs   *syncBuffer

	syncMu sync.Mutex // serializes syncIndex
}

type fleetOpts struct {
	nodes     int
	engine    simengine.Config
	policy    string
	cfg       func(*Config)          // the front door's
	svc       func(*requests.Config) // the request service's
	pickerCfg requests.PolicyPickerConfig
	health    *requests.HealthConfig
}

// healthTap passes every report on to the fleet's Health and counts the failures.
type healthTap struct {
	*requests.Health
	failures atomic.Int64
}

func (h *healthTap) ReportFailure(node string) {
	h.failures.Add(1)
	h.Health.ReportFailure(node)
}

// newService is a request service with the default configuration over picker.
func newService(tb testing.TB, picker requests.Picker) *requests.Service {
	tb.Helper()
	return newServiceWith(tb, requests.DefaultConfig(), requests.Deps{Picker: picker})
}

// newServiceWith is a request service with cfg and deps.
func newServiceWith(tb testing.TB, cfg requests.Config, deps requests.Deps) *requests.Service {
	tb.Helper()
	svc, err := requests.New(cfg, deps)
	if err != nil {
		tb.Fatal(err)
	}
	return svc
}

// newPolicyPicker is the default prefixmesh PolicyPicker over src and idx.
func newPolicyPicker(tb testing.TB, src requests.NodeSource, idx *routing.Index) *requests.PolicyPicker {
	tb.Helper()
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		tb.Fatal(err)
	}
	p, err := requests.NewPolicyPicker(src, idx, routing.NewOverlay(0, 0), pol, requests.PolicyPickerConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func startFleet(t *testing.T, o fleetOpts) *fleet {
	t.Helper()
	if o.nodes == 0 {
		o.nodes = 4
	}
	if o.engine.Model == "" {
		o.engine = fastEngineConfig()
	}
	var nodes []*simNode
	var targets []requests.NodeTarget
	for i := range o.nodes {
		n := startSimNode(t, fmt.Sprintf("node-%d", i), o.engine)
		nodes = append(nodes, n)
		targets = append(targets, target(n.id, n.srv.URL))
	}
	f := startFrontDoor(t, targets, o)
	f.nodes = nodes
	for _, n := range nodes {
		f.index.ReplaceNode(n.id, n.epoch, 0, nil)
	}
	return f
}

// startFrontDoor serves a front door with a PolicyPicker over targets on 127.0.0.1:0.
func startFrontDoor(t *testing.T, targets []requests.NodeTarget, o fleetOpts) *fleet {
	t.Helper()
	f := &fleet{list: &nodeList{}, index: routing.NewIndex(routing.DefaultIndexConfig()), reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	f.list.set(targets)
	var err error
	hc := requests.DefaultHealthConfig()
	if o.health != nil {
		hc = *o.health
	}
	if f.health, err = requests.NewHealth(hc, f.list, nil, nil); err != nil {
		t.Fatal(err)
	}
	pol, err := routing.NewPolicy(o.policy, routing.DefaultPolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	pc := o.pickerCfg
	pc.Ejector = f.health
	f.picker, err = requests.NewPolicyPicker(f.list, f.index, routing.NewOverlay(0, 0), pol, pc)
	if err != nil {
		t.Fatal(err)
	}
	f.picker.Start(t.Context())
	t.Cleanup(f.picker.Close)
	sc := requests.DefaultConfig()
	if o.svc != nil {
		o.svc(&sc)
	}
	f.tap = &healthTap{Health: f.health}
	f.svc = newServiceWith(t, sc, requests.Deps{Picker: f.picker, Health: f.tap, Nodes: f.list, Ejector: f.health, Registry: f.reg})
	cfg := DefaultConfig()
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	f.fd, err = New(cfg, Deps{Service: f.svc, Registry: f.reg, Logger: newTestLogger(f.logs)})
	if err != nil {
		t.Fatal(err)
	}
	f.health.OnEject(f.fd.ObserveEjection)
	f.srv = httptest.NewServer(f.fd.Handler())
	t.Cleanup(f.srv.Close)
	return f
}

// syncIndex applies every engine's journal to the index: zero propagation delay.
func (f *fleet) syncIndex(t *testing.T) {
	t.Helper()
	f.syncMu.Lock()
	defer f.syncMu.Unlock()
	for _, n := range f.nodes {
		if n.dead {
			continue
		}
		ev, head, ok := n.tree.SummarySince(n.seq, nil)
		if !ok {
			hashes, h := n.tree.SummarySnapshot(nil)
			f.index.ReplaceNode(n.id, n.epoch, h, hashes)
			n.seq = h
			continue
		}
		ch := make([]routing.Change, len(ev))
		for i, e := range ev {
			ch[i] = routing.Change{Hash: e.Hash, Added: e.Added}
		}
		if err := f.index.ApplyDelta(n.id, n.epoch, n.seq, head, ch); err != nil {
			t.Fatalf("apply delta of %s: %v", n.id, err)
		}
		n.seq = head
	}
}

// killNode kills node i between two index syncs.
func (f *fleet) killNode(i int) {
	f.syncMu.Lock()
	defer f.syncMu.Unlock()
	f.nodes[i].kill()
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// result is a parsed response of either kind.
type result struct {
	status   int
	header   http.Header
	text     string // completion text or assistant content
	finish   string
	done     bool // streams: saw data: [DONE]
	usage    *usageJSON
	errBody  *apiError
	chunks   int
	estimate int
	cached   int
}

type usageJSON struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type chunkJSON struct {
	Object  string `json:"object"`
	Choices []struct {
		Text    *string `json:"text"`
		Message *struct {
			Role, Content string
		} `json:"message"`
		Delta *struct {
			Role, Content string
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
	Error *struct {
		Message, Type, Code string
	} `json:"error"`
}

// do sends a request to base+path and parses the answer, SSE or JSON, the way OpenAI's clients
// do: for SSE, "data:" lines carry JSON until "data: [DONE]"; other fields and comments are
// ignored; events end at a blank line.
func do(ctx context.Context, client *http.Client, base, path string, body any, header http.Header) (*result, error) {
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	r := &result{status: resp.StatusCode, header: resp.Header, estimate: -1, cached: -1}
	fmt.Sscan(resp.Header.Get(HeaderEstimate), &r.estimate)
	fmt.Sscan(resp.Header.Get(requests.HeaderCachedTokens), &r.cached)
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			return r, err
		}
		if resp.StatusCode != http.StatusOK {
			r.errBody = new(apiError)
			if err := json.Unmarshal(raw, r.errBody); err != nil {
				return r, fmt.Errorf("error body %q: %w", raw, err)
			}
			return r, nil
		}
		var c chunkJSON
		if err := json.Unmarshal(raw, &c); err != nil {
			return r, fmt.Errorf("body %q: %w", raw, err)
		}
		r.usage = c.Usage
		for _, ch := range c.Choices {
			if ch.Text != nil {
				r.text += *ch.Text
			}
			if ch.Message != nil {
				r.text += ch.Message.Content
			}
			if ch.FinishReason != nil {
				r.finish = *ch.FinishReason
			}
		}
		return r, nil
	}
	err = readSSE(resp.Body, func(data []byte) error {
		if r.done {
			return fmt.Errorf("data after [DONE]: %q", data)
		}
		if string(data) == "[DONE]" {
			r.done = true
			return nil
		}
		var c chunkJSON
		if err := json.Unmarshal(data, &c); err != nil {
			return fmt.Errorf("chunk %q: %w", data, err)
		}
		if c.Error != nil {
			return fmt.Errorf("stream error event: %s", c.Error.Message)
		}
		r.chunks++
		if c.Usage != nil {
			r.usage = c.Usage
		}
		for _, ch := range c.Choices {
			if ch.Text != nil {
				r.text += *ch.Text
			}
			if ch.Delta != nil {
				r.text += ch.Delta.Content
			}
			if ch.FinishReason != nil {
				r.finish = *ch.FinishReason
			}
		}
		return nil
	})
	return r, err
}

// readSSE reads server-sent events (WHATWG HTML §9.2) and calls f with each event's data: the
// "data" field lines joined by "\n"; "event", "id", "retry" and comment lines are ignored.
func readSSE(body io.Reader, f func(data []byte) error) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var data []byte
	have := false
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			if have {
				if err := f(data); err != nil {
					return err
				}
			}
			data, have = data[:0], false
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		if string(field) == "data" {
			if have {
				data = append(data, '\n')
			}
			data = append(data, value...)
			have = true
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if have {
		return f(data)
	}
	return nil
}

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// apiError is the OpenAI error body as a client decodes it.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// counterValue reads a counter (or a counter vector's sum) from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func chatBody(msgs []tokenizer.ChatMessage, stream bool, maxTokens int) map[string]any {
	b := map[string]any{"model": simModel, "messages": msgs, "max_tokens": maxTokens}
	if stream {
		b["stream"] = true
		b["stream_options"] = map[string]any{"include_usage": true}
	}
	return b
}

func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// httptestServer serves h on 127.0.0.1:0 for the test's duration.
func httptestServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// recv receives from ch, failing the test after 10 s.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// benchFrontDoor serves a front door with the default configuration (tokenizer tok, when not
// empty) over nodes fake nodes that are all upstreamURL, and returns its URL.
func benchFrontDoor(tb testing.TB, upstreamURL string, nodes int, tok string) string {
	tb.Helper()
	list := &nodeList{}
	var targets []requests.NodeTarget
	for i := range nodes {
		targets = append(targets, target(fmt.Sprintf("n%d", i), upstreamURL))
	}
	list.set(targets)
	sc := requests.DefaultConfig()
	if tok != "" {
		sc.Tokenizer = tok
	}
	svc := newServiceWith(tb, sc, requests.Deps{Picker: newPolicyPicker(tb, list, routing.NewIndex(routing.DefaultIndexConfig()))})
	fd, err := New(DefaultConfig(), Deps{Service: svc, Registry: prometheus.NewRegistry()})
	if err != nil {
		tb.Fatal(err)
	}
	front := httptest.NewServer(fd.Handler())
	tb.Cleanup(front.Close)
	return front.URL
}
