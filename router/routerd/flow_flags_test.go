package routerd

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/router/flow"
)

// TestFlowFlags: the flow control flags reach flow.Config, their defaults are flow's, and a bad
// value is refused naming its flag.
func TestFlowFlags(t *testing.T) {
	def, err := DefaultServeConfig().flowConfig()
	if err != nil {
		t.Fatal(err)
	}
	want := flow.DefaultConfig()
	want.ModelClasses = map[string]flow.Class{}
	if !reflect.DeepEqual(def, want) {
		t.Fatalf("default %+v, want flow's %+v", def, want)
	}
	cfg, err := parseServeConfig([]string{"--insecure-gossip", "--flow-control", "--priority-default=batch=sheddable,chat=critical",
		"--flow-queue-threshold=8", "--flow-kv-threshold=0.9", "--flow-stale-after=2s", "--flow-max-queued=100",
		"--flow-class-queued=sheddable=10", "--flow-max-wait=standard=5s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	fc, err := cfg.flowConfig()
	if err != nil || !cfg.FlowControl {
		t.Fatal(err)
	}
	if fc.ModelClasses["batch"] != flow.Sheddable || fc.ModelClasses["chat"] != flow.Critical ||
		fc.Thresholds != (flow.Thresholds{QueueDepth: 8, KVUtil: 0.9, StaleAfter: 2 * time.Second}) ||
		fc.Limits.MaxTotal != 100 || fc.Limits.MaxQueued != [flow.NumClasses]int{1024, 1024, 10} ||
		fc.Limits.MaxWait != [flow.NumClasses]time.Duration{time.Minute, 5 * time.Second, 10 * time.Second} {
		t.Fatalf("flow config %+v", fc)
	}
	for flag, args := range map[string][]string{
		"--priority-default":     {"--priority-default=batch=urgent"},
		"--flow-class-queued":    {"--flow-class-queued=standard=-1"},
		"--flow-max-wait":        {"--flow-max-wait=critical=0s"},
		"--flow-kv-threshold":    {"--flow-kv-threshold=1.5"},
		"--flow-queue-threshold": {"--flow-queue-threshold=0"},
		"--flow-max-queued":      {"--flow-max-queued=-1"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), append([]string{"--validate-only", "--insecure-gossip"}, args...), &out, &errb)
		if code != 2 {
			t.Errorf("%v: exit %d, %q; want 2", args, code, errb.String())
		}
		if !strings.Contains(errb.String(), flag) {
			t.Errorf("%v: %q does not name %s", args, errb.String(), flag)
		}
	}
}
