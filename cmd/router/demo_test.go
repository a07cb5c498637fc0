package main

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemoQuick runs the demo end to end in its short mode (two policies on fresh clusters of
// two nodes, a built-in synthetic trace) and checks the result lines.
func TestDemoQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two small clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	args := []string{"--quick", "--nodes=2", "--requests=24", "--speed=8",
		"--trace=" + filepath.Join(t.TempDir(), "absent.jsonl"), "--prefill-tokens-per-s=200000"}
	if code := runDemo(ctx, args, &out, &errb); code != 0 {
		t.Fatalf("demo exited %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	s := out.String()
	for _, want := range []string{"built-in synthetic trace", "[prefixmesh] cluster ready", "[round-robin] 24/24 requests done",
		"results (24 requests each", "prefix hit ratio", "estimate exact", "of 24", "time compressed", "estimate exact: the share"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if m := regexp.MustCompile(`requests \(errors\)\s+24 \(0\)\s+24 \(0\)`).FindString(s); m == "" {
		t.Errorf("requests failed:\n%s", s)
	}
	if strings.Contains(s, "keeps serving") {
		t.Errorf("--quick must not serve afterwards:\n%s", s)
	}
}

func TestDemoFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := runDemo(context.Background(), []string{"--nodes=0"}, &out, &errb); code != 2 {
		t.Fatalf("--nodes=0: exit %d", code)
	}
	if code := runDemo(context.Background(), []string{"--pd", "--nodes=1"}, &out, &errb); code != 2 {
		t.Fatalf("--pd --nodes=1: exit %d (one node cannot be split into pools)", code)
	}
	if got := pdRoles(5); strings.Join(got, ",") != "prefill,prefill,decode,decode,decode" {
		t.Fatalf("pdRoles(5) = %v", got)
	}
	// --quick is the full run with time compressed: the same requests, every rate quickCompress
	// times faster, so that its hit ratios and TTFT ratio are the full run's.
	full, cfg := defaultDemoConfig(), defaultDemoConfig()
	cfg.quick()
	if cfg.Serve || cfg.Requests != full.Requests || cfg.From != full.From || cfg.Nodes != full.Nodes || cfg.KVBlocks != full.KVBlocks ||
		cfg.MaxOutputTokens != full.MaxOutputTokens || cfg.Speed != quickCompress*full.Speed ||
		cfg.PrefillPerSec != quickCompress*full.PrefillPerSec || cfg.DecodePerSec != quickCompress*full.DecodePerSec {
		t.Fatalf("quick config %+v\nwant the full run %+v with time compressed %d×", cfg, full, quickCompress)
	}
}

// TestDemoGateway runs the demo's gateway mode: the prefixmesh policy through the front door and
// through the fake gateway in front of the endpoint picker, each on a fresh cluster; both answer
// every request and the gateway's run reports the picker's estimate accuracy.
func TestDemoGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two small clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	args := []string{"--quick", "--gateway", "--policies=prefixmesh", "--nodes=2", "--requests=24", "--speed=8",
		"--trace=" + filepath.Join(t.TempDir(), "absent.jsonl"), "--prefill-tokens-per-s=200000"}
	if code := runDemo(ctx, args, &out, &errb); code != 0 {
		t.Fatalf("demo exited %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	s := out.String()
	for _, want := range []string{"[prefixmesh/gw] fake gateway on", "[prefixmesh/gw] 24/24 requests done", "prefixmesh/gw"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if m := regexp.MustCompile(`requests \(errors\)\s+24 \(0\)\s+24 \(0\)`).FindString(s); m == "" {
		t.Errorf("requests failed:\n%s", s)
	}
	if m := regexp.MustCompile(`estimate exact\s+\S+% of \d+\s+\d+\.\d% of [1-9]`).FindString(s); m == "" {
		t.Errorf("no estimate accuracy for the gateway's run:\n%s", s)
	}
}

// TestDemoPD runs the demo's P/D mode: the prefixmesh policy on two aggregated nodes, then on one
// prefill and one decode node; every request is answered and the side-by-side table says how
// many were disaggregated.
func TestDemoPD(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two small clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	args := []string{"--quick", "--pd", "--policies=prefixmesh", "--nodes=2", "--requests=24", "--speed=8",
		"--trace=" + filepath.Join(t.TempDir(), "absent.jsonl"), "--prefill-tokens-per-s=200000"}
	if code := runDemo(ctx, args, &out, &errb); code != 0 {
		t.Fatalf("demo exited %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	s := out.String()
	for _, want := range []string{"1 prefill + 1 decode nodes, --disaggregate auto", "[prefixmesh/pd] 24/24 requests done",
		"P/D against aggregated (prefixmesh, 2 nodes", "cached tokens", "TTFT p99"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if m := regexp.MustCompile(`requests \(errors\)\s+24 \(0\)\s+24 \(0\)\n`).FindAllString(s, -1); len(m) != 1 {
		t.Errorf("requests failed:\n%s", s)
	}
	if m := regexp.MustCompile(`disaggregated\s+-\s+\d+ of 24`).FindString(s); m == "" {
		t.Errorf("no count of disaggregated requests:\n%s", s)
	}
}
