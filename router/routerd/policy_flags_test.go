package routerd

import (
	"bytes"
	"context"
	"strings"
	"testing"

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
	for flag, args := range map[string][]string{
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
