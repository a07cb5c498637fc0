package sim

import (
	"reflect"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// With instant, lossless sharing, R routers that tell each other every decision and their
// in-flight load route as one: the same hit ratio and TTFT as a single router. Without
// sharing, each router's overlay and load view miss the others' work and routing falls apart.
func TestRoutersSharingRouteAsOne(t *testing.T) {
	tr := testTrace(t, 5, 600, 40*time.Millisecond)
	cfg := smallConfig()
	one, _ := run(t, tr, routing.PolicyPrefixMesh, cfg)
	cfg.Routers = 4
	cfg.ShareDelay, cfg.ShareInterval = 0, time.Millisecond
	shared, s := run(t, tr, routing.PolicyPrefixMesh, cfg)
	if shared.Routers != 4 || !shared.Sharing || shared.ShareMessages == 0 || shared.ShareBytesPerRouterPerSec <= 0 {
		t.Fatalf("sharing run %+v", shared)
	}
	if shared.HitRatio < 0.98*one.HitRatio || shared.TTFTMean > 1.05*one.TTFTMean {
		t.Fatalf("4 routers sharing: hit %.4f TTFT %.3f; one router: hit %.4f TTFT %.3f", shared.HitRatio, shared.TTFTMean, one.HitRatio, one.TTFTMean)
	}
	for _, rt := range s.routers {
		if rt.dec.Peers() > 3 {
			t.Fatalf("%s counts %d peers", rt.id, rt.dec.Peers())
		}
		for _, n := range s.nodes {
			if l := rt.dec.OwnInFlight(n.id); l != (routing.InFlight{}) {
				t.Fatalf("%s still counts %+v on %s", rt.id, l, n.id)
			}
		}
	}
	cfg.Sharing = false
	alone, _ := run(t, tr, routing.PolicyPrefixMesh, cfg)
	if alone.ShareMessages != 0 || alone.HitRatio >= shared.HitRatio {
		t.Fatalf("4 routers alone: hit %.4f (%d share messages), sharing %.4f", alone.HitRatio, alone.ShareMessages, shared.HitRatio)
	}
	t.Logf("hit ratio: 1 router %.4f, 4 sharing %.4f, 4 alone %.4f; TTFT mean %.3f / %.3f / %.3f s",
		one.HitRatio, shared.HitRatio, alone.HitRatio, one.TTFTMean, shared.TTFTMean, alone.TTFTMean)
}

// Many routers with lossy sharing and lossy deltas are still deterministic, and every request
// is served.
func TestRoutersDeterministicWithLoss(t *testing.T) {
	tr := testTrace(t, 6, 300, 60*time.Millisecond)
	cfg := smallConfig()
	cfg.Routers, cfg.Loss, cfg.ShareLoss, cfg.Seed = 3, 0.1, 0.2, 3
	for _, p := range []string{routing.PolicyPrefixMesh, routing.PolicyDynamoCost, routing.PolicyRoundRobin} {
		a, _ := run(t, tr, p, cfg)
		b, _ := run(t, tr, p, cfg)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two runs differ", p)
		}
		if a.Served != len(tr.Requests) || a.ShareLost == 0 {
			t.Fatalf("%s: served %d of %d, %d share packets lost", p, a.Served, len(tr.Requests), a.ShareLost)
		}
	}
}

// Sessions stick to one router (a client's load balancer keeps a conversation on one
// connection), and requests without one spread round-robin.
func TestRoutersClientSpread(t *testing.T) {
	tr := testTrace(t, 7, 90, 50*time.Millisecond)
	for i := range tr.Requests {
		if i%3 == 0 {
			tr.Requests[i].SessionKey = uint64(1 + i%7)
		}
	}
	cfg := smallConfig()
	cfg.Routers = 3
	_, s := run(t, tr, routing.PolicyPrefixMesh, cfg)
	perRouter := make([]int, 3)
	for i, st := range s.reqs {
		perRouter[st.router]++
		if k := tr.Requests[i].SessionKey; k != 0 && st.router != int(k%3) {
			t.Fatalf("request %d of session %d at router %d", i, k, st.router)
		}
	}
	for r, n := range perRouter {
		if n < 20 {
			t.Fatalf("router %d got %d of 90 requests: %v", r, n, perRouter)
		}
	}
}
