package frontdoor

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

// A node that keeps failing is ejected from routing (no more requests reach it, no client sees
// an error thanks to the retry), and a probe brings it back once it answers again.
func TestEjectionAndProbeRecovery(t *testing.T) {
	bad := &scriptedUpstream{script: []int{500}}
	bad.sick.Store(true)
	good := &scriptedUpstream{script: []int{200}}
	badSrv, goodSrv := httptestServer(t, bad), httptestServer(t, good)
	hc := requests.DefaultHealthConfig()
	hc.ProbeInterval = 5 * time.Millisecond
	hc.Backoff, hc.MaxBackoff = time.Hour, time.Hour // only the probe may bring it back
	f := startFrontDoor(t, []requests.NodeTarget{target("bad", badSrv.URL), target("good", goodSrv.URL)}, fleetOpts{health: &hc})
	send := func(i int) *result {
		t.Helper()
		r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt":"prompt number %d is long enough to fill one whole block of sixteen tokens or more"}`, i), nil)
		if err != nil || r.status != 200 {
			t.Fatalf("request %d: %+v %v", i, r, err)
		}
		return r
	}
	i := 0
	for ; !f.health.Ejected("bad"); i++ {
		if i == 100 {
			t.Fatal("bad node not ejected after 100 requests")
		}
		send(i)
	}
	if bad.hits.Load() != 3 || counterValue(t, f.reg, "prefixmesh_frontdoor_ejections_total") != 1 {
		t.Fatalf("ejected after %d failures (ejections %v), want 3", bad.hits.Load(), counterValue(t, f.reg, "prefixmesh_frontdoor_ejections_total"))
	}
	for range 20 {
		send(i)
		i++
	}
	if bad.hits.Load() != 3 {
		t.Fatalf("ejected node still received requests: %d", bad.hits.Load())
	}
	f.health.ProbeOnce(t.Context()) // still sick: stays out
	if !f.health.Ejected("bad") {
		t.Fatal("a failing probe brought the node back")
	}
	// The node recovers; the probe loop notices.
	bad.script = []int{200} // no request reaches it while ejected, so no race with the handler
	bad.sick.Store(false)
	f.health.Start(t.Context())
	defer f.health.Close()
	eventually(t, "the probe to bring the node back", func() bool { return !f.health.Ejected("bad") })
	before := bad.hits.Load()
	for j := 0; bad.hits.Load() == before; j++ {
		if j == 100 {
			t.Fatal("recovered node gets no traffic")
		}
		send(i)
		i++
	}
}
