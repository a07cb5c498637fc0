package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/buildinfo"
)

func TestDispatch(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{
		{"--validate-only", "--insecure-gossip"},          // flags first: serve
		{"serve", "--validate-only", "--insecure-gossip"}, // explicit serve
	} {
		var out, errb bytes.Buffer
		if code := dispatch(ctx, args, &out, &errb); code != 0 || out.String() != "ok\n" {
			t.Errorf("%v: code %d, %q %q", args, code, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := dispatch(ctx, []string{"launch"}, &out, &errb); code != 2 || errb.Len() == 0 {
		t.Errorf("unknown subcommand: code %d, %q", code, errb.String())
	}
}

// TestHelpListsEverySubcommand: --help names every registered subcommand.
func TestHelpListsEverySubcommand(t *testing.T) {
	for _, arg := range []string{"help", "-h", "--help"} {
		var out, errb bytes.Buffer
		if code := dispatch(context.Background(), []string{arg}, &out, &errb); code != 0 {
			t.Fatalf("%s: code %d, %q", arg, code, errb.String())
		}
		for name := range subcommands {
			if !strings.Contains(out.String(), "\n  "+name+" ") {
				t.Errorf("%s does not list %q:\n%s", arg, name, out.String())
			}
		}
	}
}

// TestHelpExitsZero: "--help" and "-h" print a subcommand's usage and exit 0, for every
// subcommand and the top level, as Go's flag package and POSIX utilities do for a help request.
func TestHelpExitsZero(t *testing.T) {
	for name := range subcommands {
		for _, h := range []string{"--help", "-h"} {
			var out, errb bytes.Buffer
			if code := dispatch(context.Background(), []string{name, h}, &out, &errb); code != 0 {
				t.Errorf("%s %s: exit %d, stderr %q", name, h, code, errb.String())
			}
			if out.Len()+errb.Len() == 0 {
				t.Errorf("%s %s printed nothing", name, h)
			}
		}
	}
	// A usage error still exits 2.
	for _, args := range [][]string{{"pins"}, {"tokenize"}, {"pins", "list", "--nope"}} {
		var out, errb bytes.Buffer
		if code := dispatch(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

// TestVersionFlag: --version prints the binary's version (internal/buildinfo) and exits 0.
func TestVersionFlag(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		var out, errb bytes.Buffer
		if code := dispatch(context.Background(), []string{arg}, &out, &errb); code != 0 {
			t.Fatalf("%s: exit %d, %q", arg, code, errb.String())
		}
		if want := "prefixmesh-router " + buildinfo.Version() + "\n"; out.String() != want {
			t.Errorf("%s printed %q, want %q", arg, out.String(), want)
		}
	}
}

// TestPolicyKnobsSameInSimAndServe: a policy setting tuned with `sim` deploys with the same flag
// on `serve` (and the chart's router values, checked by scripts/checkchart.sh): each knob is a
// flag of both, with the same default.
func TestPolicyKnobsSameInSimAndServe(t *testing.T) {
	help := func(sub string) string {
		var out, errb bytes.Buffer
		if code := dispatch(context.Background(), []string{sub, "--help"}, &out, &errb); code != 0 {
			t.Fatalf("%s --help: exit %d", sub, code)
		}
		return out.String() + errb.String()
	}
	simHelp, serveHelp := help("sim"), help("serve")
	for _, knob := range []string{"load-factor", "miss-penalty", "min-load-bound"} {
		s, v := flagDefault(simHelp, knob), flagDefault(serveHelp, knob)
		if s == "" || v == "" || s != v {
			t.Errorf("--%s: sim default %q, serve default %q; want the same flag with the same default in both", knob, s, v)
		}
	}
}

// flagDefault finds "-name" in Go flag package usage text and returns its "(default …)", or
// "missing" for a flag without one shown (a zero default) and "" when the flag is absent.
func flagDefault(usage, name string) string {
	lines := strings.Split(usage, "\n")
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "-"+name {
			continue
		}
		// The description is on the next line(s), indented.
		for _, d := range lines[i+1:] {
			if !strings.HasPrefix(d, "    \t") && !strings.HasPrefix(d, "\t") {
				break
			}
			if j := strings.Index(d, "(default "); j >= 0 {
				return strings.TrimSuffix(d[j+len("(default "):], ")")
			}
		}
		return "missing"
	}
	return ""
}
