package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster/pins"
	"google.golang.org/grpc"
)

// startPinsServer runs a one-voter pin store and its Pins gRPC service on 127.0.0.1:0.
func startPinsServer(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := pins.DefaultConfig()
	cfg.ServerID = "router-0"
	cfg.DataDir = t.TempDir()
	cfg.RaftBind = "127.0.0.1:0"
	cfg.GRPCAddr = lis.Addr().String()
	cfg.Bootstrap = true
	cfg.HeartbeatTimeout = 50 * time.Millisecond
	cfg.ElectionTimeout = 50 * time.Millisecond
	cfg.LeaderLeaseTimeout = 50 * time.Millisecond
	cfg.LogOutput = io.Discard
	store, err := pins.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	tokenize := func(text string) ([]uint32, error) { // one token per byte, enough for a test
		out := make([]uint32, len(text))
		for i := range text {
			out[i] = uint32(text[i])
		}
		return out, nil
	}
	pins.NewService(store, tokenize).Register(gs)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	t.Cleanup(func() {
		gs.Stop()
		<-done
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = store.Shutdown(ctx)
	})
	deadline := time.Now().Add(10 * time.Second)
	for !store.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("single voter did not become leader")
		}
		time.Sleep(2 * time.Millisecond)
	}
	return lis.Addr().String()
}

func pinsCmd(t *testing.T, addr string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code = runPins(ctx, append([]string{"--addr", addr}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestPinsCLI(t *testing.T) {
	addr := startPinsServer(t)
	ok := func(args ...string) string {
		t.Helper()
		code, out, errs := pinsCmd(t, addr, args...)
		if code != 0 {
			t.Fatalf("pins %v: exit %d, stderr %q", args, code, errs)
		}
		return out
	}
	out := ok("put-adapter", "--id", "7", "--name", "sql-lora", "--base-model", "llama-3-8b", "--revision", "v3")
	if !strings.HasPrefix(out, "adapter 7 now at version ") {
		t.Fatalf("put-adapter output %q", out)
	}
	out = ok("pin", "--adapter", "7", "--nodes", "gpu-2,gpu-1", "--if-version", "0")
	if !strings.Contains(out, "adapter 7 pinned to gpu-1,gpu-2 at version") {
		t.Fatalf("pin output %q", out)
	}
	ok("pin-prefix", "--adapter", "7", "--tokens", "1,2,3,4", "--nodes", "gpu-1")
	ok("pin-prefix", "--adapter", "7", "--text", "You are a SQL assistant.", "--nodes", "gpu-2")

	out = ok("list")
	for _, want := range []string{"answered by router-0 (leader router-0)", "ADAPTER  NAME", "sql-lora", "llama-3-8b", "gpu-1,gpu-2 (v", "PREFIX HASH", "gpu-2"} {
		if !strings.Contains(out, want) {
			t.Errorf("list output lacks %q:\n%s", want, out)
		}
	}
	var lj struct {
		Adapters []pins.Adapter    `json:"adapters"`
		Pins     []pins.AdapterPin `json:"pins"`
		Prefixes []pins.PrefixPin  `json:"prefix_pins"`
		Applied  uint64            `json:"applied_index"`
	}
	out = ok("--json", "list", "--linearizable")
	if err := json.Unmarshal([]byte(out), &lj); err != nil {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	if len(lj.Adapters) != 1 || lj.Adapters[0].Name != "sql-lora" || len(lj.Pins) != 1 || len(lj.Prefixes) != 2 || lj.Applied == 0 {
		t.Fatalf("list --json = %+v", lj)
	}
	if lj.Prefixes[0].Hash != pins.PrefixHash(7, lj.Prefixes[0].Tokens) {
		t.Fatal("prefix hash in JSON does not match its tokens")
	}
	// The connection flags also follow the command: the same JSON either way.
	if after := ok("list", "--linearizable", "--json"); after != out {
		t.Fatalf("pins list --json printed\n%s\nwant what pins --json list printed\n%s", after, out)
	}

	// A stale compare-and-set fails with exit 1 and names the current version.
	code, _, errs := pinsCmd(t, addr, "pin", "--adapter", "7", "--nodes", "gpu-3", "--if-version", "1")
	if code != 1 || !strings.Contains(errs, "FailedPrecondition") || !strings.Contains(errs, "retry with --if-version") {
		t.Fatalf("stale CAS: exit %d, stderr %q", code, errs)
	}
	// Bad input: InvalidArgument from the server, usage errors from the CLI.
	code, _, errs = pinsCmd(t, addr, "put-adapter", "--id", "8", "--name", strings.Repeat("x", pins.MaxNameLen+1))
	if code != 1 || !strings.Contains(errs, "InvalidArgument") {
		t.Fatalf("long name: exit %d, stderr %q", code, errs)
	}
	if code, _, errs = pinsCmd(t, addr, "pin", "--adapter", "7"); code != 2 || !strings.Contains(errs, "--nodes") {
		t.Fatalf("missing --nodes: exit %d, stderr %q", code, errs)
	}
	if code, _, _ = pinsCmd(t, addr, "frobnicate"); code != 2 {
		t.Fatalf("unknown command: exit %d", code)
	}
	if code, _, errs = pinsCmd(t, addr, "unpin", "--adapter", "99"); code != 1 || !strings.Contains(errs, "NotFound") {
		t.Fatalf("unpin unknown: exit %d, stderr %q", code, errs)
	}

	out = ok("--json", "watch", "--events", "1")
	var ev struct {
		Reset bool `json:"reset"`
		State struct {
			Adapters []pins.Adapter `json:"adapters"`
		} `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &ev); err != nil || !ev.Reset || len(ev.State.Adapters) != 1 {
		t.Fatalf("watch --json first event %q: %v", out, err)
	}
	out = ok("unpin-prefix", "--adapter", "7", "--tokens", "1,2,3,4")
	if !strings.Contains(out, "unpinned") {
		t.Fatalf("unpin-prefix output %q", out)
	}
	ok("unpin", "--adapter", "7")
	ok("delete-adapter", "--id", "7")
	out = ok("list")
	if strings.Contains(out, "sql-lora") || !strings.Contains(out, "no prefix pins") {
		t.Fatalf("list after delete:\n%s", out)
	}
}

func TestPinsMembers(t *testing.T) {
	addr := startPinsServer(t)
	code, out, errs := pinsCmd(t, addr, "members")
	if code != 0 {
		t.Fatalf("members exited %d: %s", code, errs)
	}
	for _, want := range []string{"answered by router-0 (Leader", "leader router-0", "router-0", "voter", "is leader"} {
		if !strings.Contains(out, want) {
			t.Fatalf("members output lacks %q:\n%s", want, out)
		}
	}
	code, out, errs = pinsCmd(t, addr, "--json", "members")
	if code != 0 {
		t.Fatalf("members --json exited %d: %s", code, errs)
	}
	var m membersJSON
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("members --json: %v\n%s", err, out)
	}
	if m.LeaderID != "router-0" || len(m.Servers) != 1 || !m.Servers[0].Voter || !m.Servers[0].Leader ||
		m.Servers[0].LastContactSeconds == nil || *m.Servers[0].LastContactSeconds != 0 {
		t.Fatalf("members --json = %+v", m)
	}
}
