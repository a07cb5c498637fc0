package routerd

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

// TestPolicyKnobs: --load-factor, --miss-penalty and --min-load-bound reach the policy the router
// runs (the same names as `prefixmesh-router sim`'s flags and the chart's router values), their
// defaults are routing.DefaultPolicyConfig's, and a bad value is refused naming its flag.
func TestPolicyKnobs(t *testing.T) {
	cfg, err := parseServeConfig([]string{"--insecure-gossip", "--load-factor=1.5", "--miss-penalty=3", "--min-load-bound=2"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	pc := cfg.policyConfig()
	if pc.LoadFactor != 1.5 || pc.MissPenalty != 3 || pc.MinLoadBound != 2 {
		t.Fatalf("policy config %+v: want LoadFactor 1.5, MissPenalty 3, MinLoadBound 2", pc)
	}
	def, want := DefaultServeConfig().policyConfig(), routing.DefaultPolicyConfig()
	if def.LoadFactor != want.LoadFactor || def.MissPenalty != want.MissPenalty || def.MinLoadBound != want.MinLoadBound {
		t.Fatalf("default policy config %+v, want routing's %+v", def, want)
	}
	// --tier-load-cost: the named tiers change, the others keep their defaults; the default
	// round-trips to routing's.
	cfg, err = parseServeConfig([]string{"--insecure-gossip", "--tier-load-cost=cpu=0.5, remote=0.9"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want.TierLoadCost[local.TierCPU], want.TierLoadCost[local.TierRemote] = 0.5, 0.9
	if got := cfg.policyConfig().TierLoadCost; got != want.TierLoadCost {
		t.Fatalf("tier costs %v, want %v", got, want.TierLoadCost)
	}
	if got := DefaultServeConfig().policyConfig().TierLoadCost; !near4(got, routing.DefaultPolicyConfig().TierLoadCost) {
		t.Fatalf("default tier costs %v, want routing's %v", got, routing.DefaultPolicyConfig().TierLoadCost)
	}
	// --decode-stall and --peer-pull reach the P/D and peer-pull decisions; their defaults are
	// routing's.
	cfg, err = parseServeConfig([]string{"--insecure-gossip", "--decode-stall=0.5", "--peer-pull=false"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if pc := cfg.policyConfig(); pc.DecodeStall != 0.5 || pc.PeerPull {
		t.Fatalf("decode stall %v, peer pull %v: want 0.5 and off", pc.DecodeStall, pc.PeerPull)
	}
	if pc := DefaultServeConfig().policyConfig(); pc.DecodeStall != want.DecodeStall || pc.PeerPull != want.PeerPull {
		t.Fatalf("default decode stall %v, peer pull %v: want routing's %v, %v", pc.DecodeStall, pc.PeerPull, want.DecodeStall, want.PeerPull)
	}
	for flag, args := range map[string][]string{
		"--decode-stall":   {"--decode-stall=-1"},
		"--tier-load-cost": {"--tier-load-cost=gpu=1"},
		"--miss-penalty":   {"--miss-penalty=-1"},
		"--min-load-bound": {"--min-load-bound=-1"},
		"--load-factor":    {"--load-factor=0.5"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), append([]string{"--validate-only", "--insecure-gossip"}, args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), flag) {
			t.Errorf("%v: exit %d, %q; want 2 naming %s", args, code, errb.String(), flag)
		}
	}
}

// near4 compares tier costs to the 4 significant digits the flag's default is written with.
func near4(a, b [local.NumTiers]float64) bool {
	for i := range a {
		if d := a[i] - b[i]; d > 1e-4*b[i] || d < -1e-4*b[i] {
			return false
		}
	}
	return true
}
