package cluster

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

type fakeResolver struct {
	hosts map[string][]string
	srv   map[string][]*net.SRV
}

func (r fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	if a, ok := r.hosts[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func (r fakeResolver) LookupSRV(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
	if s, ok := r.srv[name]; ok {
		return name, s, nil
	}
	return "", nil, errors.New("no such service")
}

func TestResolveSeeds(t *testing.T) {
	r := fakeResolver{
		hosts: map[string][]string{
			"prefixmesh-gossip.ns.svc": {"10.0.0.1", "10.0.0.2"},
			"pod-0.gossip.ns.svc":      {"10.0.1.1"},
		},
		srv: map[string][]*net.SRV{
			"_gossip._udp.prefixmesh.ns.svc": {{Target: "pod-0.gossip.ns.svc.", Port: 7999}},
		},
	}
	got, err := resolveSeeds(context.Background(), r, []string{
		"127.0.0.1:7000", "10.9.9.9", "prefixmesh-gossip.ns.svc", "dns+srv:_gossip._udp.prefixmesh.ns.svc", "[::1]:7001", " ",
	}, 7946)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"127.0.0.1:7000", "10.9.9.9:7946", "10.0.0.1:7946", "10.0.0.2:7946", "10.0.1.1:7999", "[::1]:7001"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	got, err = resolveSeeds(context.Background(), r, []string{"missing.svc", "127.0.0.1:1"}, 7946)
	if err == nil || !reflect.DeepEqual(got, []string{"127.0.0.1:1"}) {
		t.Fatalf("partial resolution: %v %v", got, err)
	}
	if _, err := resolveSeeds(context.Background(), r, []string{"host:notaport"}, 1); err == nil {
		t.Fatal("bad port accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig(RoleNode, "n")
	ok.Keys = [][]byte{testKey}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"no key":           func(c *Config) { c.Keys = nil },
		"bad key":          func(c *Config) { c.Keys = [][]byte{[]byte("short")} },
		"role":             func(c *Config) { c.Meta.Role = 0 },
		"no id":            func(c *Config) { c.Meta.NodeID = "" },
		"port":             func(c *Config) { c.BindPort = 70000 },
		"interval":         func(c *Config) { c.PublishInterval = 0 },
		"silence":          func(c *Config) { c.SilenceTimeout = c.HeartbeatInterval },
		"profile":          func(c *Config) { c.Profile = "fast" },
		"label":            func(c *Config) { c.Label = strings.Repeat("l", 256) },
		"meta over 512":    func(c *Config) { c.Meta.EngineURL, c.Meta.Model = strings.Repeat("u", 255), strings.Repeat("m", 255) },
		"zero concurrency": func(c *Config) { c.RepairConcurrency = 0 },
	} {
		c := ok
		mod(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
			t.Errorf("%s: %v", name, err)
		}
	}
	c := ok
	c.Keys, c.InsecureGossip = nil, true
	if err := c.Validate(); err != nil {
		t.Fatalf("explicit plaintext refused: %v", err)
	}
}

func TestFlagsAndKeyFile(t *testing.T) {
	dir := t.TempDir()
	k1, k2 := make([]byte, 32), make([]byte, 16)
	k1[0], k2[0] = 1, 2
	path := filepath.Join(dir, "key")
	body := "# primary first\n" + base64.StdEncoding.EncodeToString(k1) + "\n\n" + base64.StdEncoding.EncodeToString(k2) + "\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	f := DefaultFlags()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.Register(fs)
	if err := fs.Parse([]string{"--gossip-listen", "127.0.0.1:0", "--join", "a:1,b:2", "--join", "dns+srv:_g._udp.x",
		"--gossip-key-file", path, "--gossip-advertise", "10.1.2.3"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig(RoleRouter, "r")
	if err := f.Apply(&c); err != nil {
		t.Fatal(err)
	}
	if c.BindAddr != "127.0.0.1" || c.BindPort != 0 || c.AdvertiseAddr != "10.1.2.3" ||
		!reflect.DeepEqual(c.Join, []string{"a:1", "b:2", "dns+srv:_g._udp.x"}) ||
		len(c.Keys) != 2 || c.Keys[0][0] != 1 || c.Label != DefaultLabel {
		t.Fatalf("applied %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// Bad keys are refused with the line number.
	if err := os.WriteFile(path, []byte("bm90IGEga2V5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadKeyFile(path); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("short key: %v", err)
	}
	if err := (Flags{Listen: "0.0.0.0:7946"}).Validate(); err == nil {
		t.Fatal("no key and no --insecure-gossip accepted")
	}
	if err := (Flags{Listen: "nope"}).Validate(); err == nil {
		t.Fatal("bad listen accepted")
	}
}

func TestAgentLifecycle(t *testing.T) {
	cfg := testConfig(RoleNode, "solo")
	if _, err := New(cfg, Deps{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("node without source: %v", err)
	}
	a, err := New(cfg, Deps{Source: newFakeSource()})
	if err != nil {
		t.Fatal(err)
	}
	if a.Meta().Epoch == 0 {
		t.Fatal("no epoch chosen")
	}
	if err := a.Close(context.Background()); err != nil { // never started
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("start after close: %v", err)
	}
	b, _ := New(testConfig(RoleNode, "solo2"), Deps{Source: newFakeSource()})
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal("second close:", err)
	}
}
