package extproc

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node/simengine"
	"github.com/prefixmesh/prefixmesh/router/extproc/fakegw"
	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

const simModel = "prefixmesh-sim"

// waitFor bounds every wait of these tests.
const waitFor = 20 * time.Second

// eventually retries check every 5 ms until it returns nil, failing after waitFor.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, waitFor, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// nodeList is a NodeSource the test can change.
type nodeList struct {
	mu    sync.Mutex // guards nodes
	nodes []requests.NodeTarget
	peers map[string]string // node id → KV peer address (requests.NodeKVSource)
}

func (l *nodeList) NodeKV(id string) (requests.NodeKV, bool) {
	return requests.NodeKV{PeerAddr: l.peers[id]}, true
}

func (l *nodeList) Nodes() []requests.NodeTarget {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nodes
}

// simNode is a simulated engine (a faithful vLLM: node/simengine) with a real radix tree.
type simNode struct {
	id   string
	tree *local.RadixTree
	srv  *httptest.Server
}

// tb is what the rig needs of *testing.T and *testing.F.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	Context() context.Context
}

// rig is an endpoint picker over a request service over simulated engines, a gRPC server for it on
// 127.0.0.1:0, and a fake gateway in front.
type rig struct {
	t      tb
	nodes  []*simNode
	list   *nodeList
	index  *routing.Index
	picker *requests.PolicyPicker
	svc    *requests.Service
	epp    *Server
	reg    *prometheus.Registry
	grpc   *grpc.Server
	addr   string
	cc     *grpc.ClientConn
}

type rigOpts struct {
	nodes     int
	cfg       func(*Config)
	maxPer    int // MaxInFlightPerNode
	noEngines bool
	dead      int // the first dead nodes have no engine (connects are refused)
	// engines replaces the simulated engine of the nodes it lists (by index) with a handler.
	engines map[int]http.Handler
	health  requests.HealthReporter // the service's passive health (none when nil)
	flow    flow.Admitter           // the service's flow control (none when nil)
	roles   map[int]routing.Role    // the nodes' roles by index (both when absent)
	peers   map[int]string          // the nodes' KV peer addresses by index
	queued  map[int]int             // the nodes' queued prefill tokens by index
	disagg  routing.DisaggMode      // the picker's disaggregation mode
}

func newRig(t tb, o rigOpts) *rig {
	t.Helper()
	if o.nodes == 0 {
		o.nodes = 3
	}
	r := &rig{t: t, list: &nodeList{}, index: routing.NewIndex(routing.DefaultIndexConfig()), reg: prometheus.NewRegistry()}
	for i := range o.nodes {
		id := fmt.Sprintf("node-%d", i)
		n := &simNode{id: id, tree: local.NewRadixTree(local.Options{})}
		url := "http://127.0.0.1:1" // nothing listens: for tests that never forward
		if h := o.engines[i]; h != nil {
			n.srv = httptest.NewServer(h)
			t.Cleanup(n.srv.Close)
			url = n.srv.URL
		} else if !o.noEngines && i >= o.dead {
			cfg := simengine.DefaultConfig()
			cfg.KVBlocks, cfg.PrefillTokensPerSec, cfg.DecodeTokensPerSec = 8192, 1e9, 1e9
			eng, err := simengine.New(cfg, n.tree, nil, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			eng.Start(t.Context())
			n.srv = httptest.NewServer(eng.Handler())
			t.Cleanup(func() { eng.Close(); n.srv.Close() })
			url = n.srv.URL
		}
		r.nodes = append(r.nodes, n)
		r.list.nodes = append(r.list.nodes, requests.NodeTarget{EngineURL: url,
			Info: routing.NodeInfo{ID: id, Alive: true, Model: simModel, BlockSize: 16, Role: o.roles[i], QueuedPrefillTokens: o.queued[i]}})
		if a, ok := o.peers[i]; ok {
			if r.list.peers == nil {
				r.list.peers = map[string]string{}
			}
			r.list.peers[id] = a
		}
		r.index.ReplaceNode(id, uint64(i+1), 0, nil)
	}
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	r.picker, err = requests.NewPolicyPicker(r.list, r.index, routing.NewOverlay(0, 0), pol, requests.PolicyPickerConfig{MaxInFlightPerNode: o.maxPer, Disaggregate: o.disagg})
	if err != nil {
		t.Fatal(err)
	}
	scfg := requests.DefaultConfig()
	scfg.Tokenizer = "cl100k_base"
	if r.svc, err = requests.New(scfg, requests.Deps{Picker: r.picker, Nodes: r.list, Health: o.health, Flow: o.flow}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Fallbacks = 2 // the tests' gateway walks the list
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	if r.epp, err = New(cfg, Deps{Picker: r.svc, Nodes: r.list, Registry: r.reg}); err != nil {
		t.Fatal(err)
	}
	r.epp.SetReady(true)
	r.start()
	return r
}

// start serves the picker on a new listener (again after stop: a restarted picker).
func (r *rig) start() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.t.Fatal(err)
	}
	r.grpc = grpc.NewServer(r.epp.GRPCOptions()...)
	r.epp.Register(r.grpc)
	g := r.grpc
	go func() { _ = g.Serve(lis) }()
	r.t.Cleanup(g.Stop)
	r.addr = lis.Addr().String()
	cc, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20), grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = cc.Close() })
	r.cc = cc
}

// client is a raw ext_proc client to the picker.
func (r *rig) client() extprocv3.ExternalProcessorClient {
	return extprocv3.NewExternalProcessorClient(r.cc)
}

// gateway serves a fake gateway over the picker on 127.0.0.1:0 and returns it and its URL.
func (r *rig) gateway(cfg fakegw.Config) (*fakegw.Gateway, string) {
	g := fakegw.New(r.client(), cfg)
	srv := httptest.NewServer(g)
	r.t.Cleanup(srv.Close)
	return g, srv.URL
}

// syncIndex gives the index every engine's summary: zero propagation delay.
func (r *rig) syncIndex() {
	for i, n := range r.nodes {
		hashes, h := n.tree.SummarySnapshot(nil)
		r.index.ReplaceNode(n.id, uint64(i+1), h, hashes)
	}
}

// endpointNode maps an endpoint back to its node id.
func (r *rig) endpointNode(ep string) string {
	for _, n := range r.list.Nodes() {
		if endpointOf(n.EngineURL) == ep {
			return n.Info.ID
		}
	}
	return ""
}

// inFlight is the picker's own in-flight requests over every node.
func (r *rig) inFlight() int {
	total := 0
	for _, n := range r.nodes {
		total += r.picker.InFlight(n.id)
	}
	return total
}

// post sends body to the gateway at base+path and returns status, headers and body.
func post(t *testing.T, base, path, body string) (int, http.Header, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	method := http.MethodPost
	if body == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// modes are the body modes the tests drive (request, response).
var modes = []struct {
	name      string
	req, resp procv3.ProcessingMode_BodySendMode
	noConfig  bool
}{
	{"full-duplex", procv3.ProcessingMode_FULL_DUPLEX_STREAMED, procv3.ProcessingMode_FULL_DUPLEX_STREAMED, false},
	{"full-duplex-no-protocol-config", procv3.ProcessingMode_FULL_DUPLEX_STREAMED, procv3.ProcessingMode_FULL_DUPLEX_STREAMED, true},
	{"buffered", procv3.ProcessingMode_BUFFERED, procv3.ProcessingMode_BUFFERED, false},
	{"buffered-request-streamed-response", procv3.ProcessingMode_BUFFERED, procv3.ProcessingMode_FULL_DUPLEX_STREAMED, false},
	// GIE's reference Envoy config leaves the response body out (response_body_mode NONE):
	// the response headers are all the picker sees, the stream's close its end.
	{"full-duplex-headers-only-response", procv3.ProcessingMode_FULL_DUPLEX_STREAMED, procv3.ProcessingMode_NONE, false},
}

// decision waits for the gateway's n-th decision (it is recorded once the handler returns,
// which may be just after the client read the response) and returns it.
func decision(t *testing.T, g *fakegw.Gateway, n int) fakegw.Decision {
	t.Helper()
	var ds []fakegw.Decision
	eventually(t, fmt.Sprintf("decision %d recorded", n), func() error {
		if ds = g.Decisions(); len(ds) < n {
			return fmt.Errorf("%d recorded", len(ds))
		}
		return nil
	})
	return ds[n-1]
}

// counter is the value of the rig registry's counter name (0 when absent).
func (r *rig) counter(name string) float64 {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			sum := 0.0
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}
