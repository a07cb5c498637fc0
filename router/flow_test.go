package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/routing"
)

// flowServer is a Route server over mirror with flow control on the same view (FlowSource),
// sheddable requests never queued (bound 0) so that a saturated fleet sheds them at once.
func flowServer(t *testing.T, mirror fakeMirror) (pb.RouterClient, *flow.Controller) {
	t.Helper()
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	for _, n := range mirror {
		idx.ReplaceNode(n.Meta.NodeID, 1, 1, nil)
	}
	srv, err := NewServer(NewView(mirror, idx), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	fcfg := flow.DefaultConfig()
	fcfg.Limits.MaxQueued[flow.Sheddable] = 0
	fc, err := flow.New(fcfg, &FlowSource{View: NewView(mirror, idx), Decider: srv.Decider()}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	srv.flow = fc
	return startServer(t, srv), fc
}

func TestRouteFlowControl(t *testing.T) {
	busy := node("a", 16, true, 0)
	busy.Load.Waiting = 10 // twice the default queue threshold: saturated
	stale := node("b", 16, true, 0)
	stale.LoadRecv = time.Now().Add(-time.Minute) // fail-closed: counts as saturated
	idle := node("c", 16, true, 0)
	md := metadata.Pairs(strings.ToLower(flow.HeaderPriority), "sheddable", "x-prefixmesh-tenant", "acme")
	req := &pb.RouteRequest{Tokens: seq(64, 1), Model: "m"}

	t.Run("saturated: shed with the reason and retry-after", func(t *testing.T) {
		c, _ := flowServer(t, fakeMirror{busy, stale})
		var trailer metadata.MD
		_, err := c.Route(metadata.NewOutgoingContext(t.Context(), md), req, grpc.Trailer(&trailer))
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "queue-full") {
			t.Fatalf("err %v", err)
		}
		if got := trailer.Get("retry-after"); len(got) != 1 || got[0] != "1" {
			t.Fatalf("retry-after %v", got)
		}
		if got := trailer.Get("x-prefixmesh-dropped-reason"); len(got) != 1 || got[0] != "queue-full" {
			t.Fatalf("reason %v", got)
		}
		// A dry run is a probe: never queued nor shed.
		dry := &pb.RouteRequest{Tokens: req.Tokens, Model: "m", DryRun: true}
		if _, err := c.Route(metadata.NewOutgoingContext(t.Context(), md), dry); err != nil {
			t.Fatalf("dry run: %v", err)
		}
	})
	t.Run("not saturated: routed", func(t *testing.T) {
		full := node("d", 16, true, 0)
		full.Load.Waiting = 5 // saturated itself, but the mean with an idle node is 0.5
		c, _ := flowServer(t, fakeMirror{full, idle})
		if _, err := c.Route(metadata.NewOutgoingContext(t.Context(), md), req); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("no node serves the model", func(t *testing.T) {
		c, _ := flowServer(t, fakeMirror{idle})
		var trailer metadata.MD
		_, err := c.Route(t.Context(), &pb.RouteRequest{Tokens: req.Tokens, Model: "other"}, grpc.Trailer(&trailer))
		if status.Code(err) != codes.Unavailable || len(trailer.Get("retry-after")) != 1 {
			t.Fatalf("err %v trailer %v", err, trailer)
		}
	})
	t.Run("queued standard request: cancelled by its caller, removed", func(t *testing.T) {
		c, fc := flowServer(t, fakeMirror{busy})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { _, err := c.Route(ctx, req); done <- err }()
		deadline := time.Now().Add(10 * time.Second)
		for fc.Queued() != 1 {
			if time.Now().After(deadline) {
				t.Fatal("never queued")
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-done; status.Code(err) != codes.Canceled {
			t.Fatalf("err %v", err)
		}
		for fc.Queued() != 0 {
			if time.Now().After(deadline) {
				t.Fatal("still queued after its caller left")
			}
			time.Sleep(time.Millisecond)
		}
	})
}
