package node

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// testEpoch is the fixed epoch of test servers, so streamed output is reproducible.
const testEpoch = 0x5eed

// testTimeout bounds every RPC and wait in these tests.
const testTimeout = 20 * time.Second

// testNode is a real Server behind a real grpc.Server on 127.0.0.1:0 and a real client.
type testNode struct {
	tree   *local.RadixTree
	srv    *Server
	reg    *prometheus.Registry
	client pb.NodeCacheClient
	epoch  uint64 // the epoch its answers must carry: testEpoch until the test calls NewEpoch
}

// startNode serves a fresh tree with opts over loopback gRPC until the test ends.
func startNode(tb testing.TB, opts local.Options) *testNode {
	tb.Helper()
	tree := local.NewRadixTree(opts)
	reg := prometheus.NewRegistry()
	srv, err := New(tree, Config{NodeID: "node-a", BlockSize: 16, Epoch: testEpoch, Registry: reg})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	g := grpc.NewServer(srv.ServerOptions()...)
	srv.Register(g)
	served := make(chan error, 1)
	go func() { served <- g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMsgSize), grpc.MaxCallSendMsgSize(MaxMsgSize)))
	if err != nil {
		tb.Fatalf("NewClient: %v", err)
	}
	tb.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
		select {
		case err := <-served:
			if err != nil {
				tb.Errorf("Serve: %v", err)
			}
		case <-time.After(testTimeout):
			tb.Errorf("Serve did not return within %v of Stop", testTimeout)
		}
	})
	return &testNode{tree: tree, srv: srv, reg: reg, client: pb.NewNodeCacheClient(conn), epoch: testEpoch}
}

// testCtx is a context bounded by testTimeout and cancelled when the test ends.
func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	tb.Cleanup(cancel)
	return ctx
}

// prompt returns n tokens starting at first: first, first+1, …
func prompt(first uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

// blocks returns n consecutive block ids starting at first.
func blocks(first uint32, n int) []uint32 { return prompt(first, n) }

// must(call())(t) returns call's value and fails the test if call returned an error.
func must[T any](v T, err error) func(testing.TB) T {
	return func(tb testing.TB) T {
		tb.Helper()
		if err != nil {
			tb.Fatalf("unexpected error: %v", err)
		}
		return v
	}
}

// sameSet reports whether a and b hold the same values, ignoring order (values are unique).
func sameSet[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	seen := make(map[T]int, len(a))
	for _, v := range a {
		seen[v]++
	}
	for _, v := range b {
		if seen[v] == 0 {
			return false
		}
		seen[v]--
	}
	return true
}

// metricValue gathers reg and returns the value of the counter or gauge series name whose labels
// include all of labels (name=value pairs), and how many series matched.
func metricValue(tb testing.TB, reg *prometheus.Registry, name string, labels ...string) (float64, int) {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatalf("gather: %v", err)
	}
	var sum float64
	var n int
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			n++
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum, n
}
