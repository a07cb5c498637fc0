package routerd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestHelmFlags checks that `serve --validate-only` accepts exactly the flags the Helm chart
// passes (deploy/helm/prefixmesh: the router.flags ConfigMap, read with --config, plus the
// StatefulSet's args), one at a time and all together, with and without TLS and gossip keys.
func TestHelmFlags(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("placeholder\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key, ca, gossipKey := file("tls.crt"), file("tls.key"), file("ca.crt"), file("gossip.key")
	common := []string{"--log-level=info", "--drain-timeout=25s", "--gossip-listen=:7946",
		"--join=prefixmesh-gossip.default.svc.cluster.local:7946"}
	// The front door and metrics are plaintext behind the chart's NetworkPolicies; gRPC and Raft
	// are plaintext only without TLS (plain), with the flags that say so.
	router := []string{"--grpc-listen=:7080", "--http-listen=:8081", "--insecure-http", "--metrics-listen=:9090", "--insecure-metrics", "--policy=prefixmesh", "--load-factor=1.25", "--miss-penalty=10", "--min-load-bound=8",
		"--tokenizer=cl100k_base", "--raft-listen=:7000", "--raft-dir=" + filepath.Join(dir, "raft"), "--raft-bootstrap-expect=3"}
	args := []string{"--node-id=prefixmesh-router-0",
		"--raft-advertise=prefixmesh-router-0.prefixmesh-router-peers.default.svc.cluster.local:7000"}
	tls := []string{"--tls-cert=" + cert, "--tls-key=" + key, "--tls-client-ca=" + ca}
	plain := []string{"--insecure-grpc", "--insecure-raft"}
	join := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	cases := map[string][]string{
		"insecure gossip":       join(common, []string{"--insecure-gossip"}, router, plain),
		"gossip key":            join(common, []string{"--gossip-key-file=" + gossipKey}, router, plain),
		"gossip key and TLS":    join(common, []string{"--gossip-key-file=" + gossipKey}, tls, router),
		"one replica, insecure": join(common, []string{"--insecure-gossip", "--raft-bootstrap-expect=1", "--raft-listen=:7000", "--insecure-raft"}),
		"front door deadlines": {"--insecure-gossip", "--body-timeout=5s", "--first-byte-timeout-floor=1s",
			"--first-byte-timeout-ceiling=30s", "--stream-idle-timeout=2m", "--cors-allow-origins=https://a.example, *"},
		"endpoint picker, self-signed": {"--insecure-gossip", "--ext-proc-listen=:9002", "--ext-proc-fallbacks=2", "--ext-proc-self-signed",
			"--ext-proc-tls-no-client-auth"},
		"endpoint picker, mTLS": join(common, []string{"--gossip-key-file=" + gossipKey}, tls, router, []string{"--ext-proc-listen=:9002",
			"--ext-proc-tls-cert=" + cert, "--ext-proc-tls-key=" + key, "--ext-proc-tls-client-ca=" + ca}),
		"endpoint picker, plaintext": {"--insecure-gossip", "--ext-proc-listen=:9002", "--insecure-ext-proc"},
		"front door and upstream":    {"--insecure-gossip", "--max-inflight=10", "--upstream-tls-ca=" + ca, "--http-tls-cert=" + cert, "--http-tls-key=" + key},
	}
	for name, flags := range cases {
		t.Run(name, func(t *testing.T) {
			// As the chart does it: the ConfigMap's lines in --config, the pod's args on the line.
			conf := filepath.Join(t.TempDir(), "router.flags")
			if err := os.WriteFile(conf, []byte(strings.Join(flags, "\n")+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, line := range [][]string{
				append([]string{"--validate-only", "--config=" + conf}, args...),
				append(append([]string{"--validate-only"}, flags...), args...),
			} {
				var out, errb bytes.Buffer
				if code := Main(context.Background(), line, &out, &errb); code != 0 || out.String() != "ok\n" {
					t.Fatalf("%v: exit %d, %q %q", line, code, out.String(), errb.String())
				}
			}
		})
	}
}

// TestServeConfigRejects checks the new flags' validation.
func TestServeConfigRejects(t *testing.T) {
	for _, args := range [][]string{
		{"--load-factor=0.5"},
		{"--tokenizer=gpt9"},
		{"--max-inflight=0"},
		{"--raft-bootstrap-expect=-1"},
		{"--raft-bootstrap-expect=3", "--raft-listen=127.0.0.1:0"}, // peers must know our Raft address up front
		{"--raft-listen=nocolon"},
		{"--tls-cert=/nonexistent", "--tls-key=/nonexistent"},
		{"--tls-cert=x"},
		{"--upstream-tls-cert=x"},
		{"--metrics-tls-cert=x", "--metrics-tls-key=x"}, // without --metrics-listen: /metrics is the front door's
		{"--insecure-metrics"},
		{"--ext-proc-listen=127.0.0.1:9002", "--ext-proc-tls-client-ca=/nonexistent"},
	} {
		var out, errb bytes.Buffer
		line := append([]string{"--validate-only", "--insecure-gossip"}, args...)
		if code := Main(context.Background(), line, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errb.String())
		}
	}
}

// TestServeFlagsMapToConfig checks that every new flag lands in its ServeConfig field.
func TestServeFlagsMapToConfig(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "pem")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseServeConfig([]string{"--insecure-gossip", "--policy=least-loaded", "--load-factor=1.5", "--tokenizer=engine",
		"--max-inflight=7", "--raft-listen=:7001", "--raft-advertise=r0.peers:7001", "--raft-dir=/data/raft",
		"--raft-bootstrap-expect=3", "--raft-voter=false", "--tls-cert=" + f, "--tls-key=" + f, "--tls-client-ca=" + f,
		"--http-tls-cert=" + f, "--http-tls-key=" + f, "--http-tls-client-ca=" + f,
		"--upstream-tls-ca=" + f, "--upstream-tls-cert=" + f, "--upstream-tls-key=" + f,
		"--insecure-grpc", "--insecure-http", "--insecure-raft", "--tls-no-client-auth", "--http-tls-no-client-auth",
		"--metrics-listen=:9090", "--insecure-metrics", "--metrics-tls-cert=" + f, "--metrics-tls-key=" + f, "--metrics-tls-client-ca=" + f,
		"--metrics-tls-no-client-auth", "--ext-proc-listen=:9002", "--ext-proc-tls-cert=" + f, "--ext-proc-tls-key=" + f,
		"--ext-proc-tls-client-ca=" + f, "--ext-proc-tls-no-client-auth", "--insecure-ext-proc"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultServeConfig()
	want.Gossip.Insecure = true
	want.Policy, want.LoadFactor, want.Tokenizer, want.MaxInFlight = "least-loaded", 1.5, "engine", 7
	want.RaftListen, want.RaftAdvertise, want.RaftDir, want.RaftBootstrapExpect, want.RaftVoter = ":7001", "r0.peers:7001", "/data/raft", 3, false
	want.TLSCert, want.TLSKey, want.TLSClientCA = f, f, f
	want.HTTPTLSCert, want.HTTPTLSKey, want.HTTPTLSClientCA = f, f, f
	want.UpstreamTLSCA, want.UpstreamTLSCert, want.UpstreamTLSKey = f, f, f
	want.InsecureGRPC, want.InsecureHTTP, want.InsecureRaft, want.TLSNoClientAuth, want.HTTPTLSNoClientAuth = true, true, true, true, true
	want.MetricsListen, want.InsecureMetrics, want.MetricsTLSNoClientAuth = ":9090", true, true
	want.MetricsTLSCert, want.MetricsTLSKey, want.MetricsTLSClientCA = f, f, f
	want.ExtProc = ExtProcConfig{Listen: ":9002", TLSCert: f, TLSKey: f, TLSClientCA: f, NoClientAuth: true, Insecure: true}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("parsed %+v\nwant   %+v", cfg, want)
	}
	if d := DefaultServeConfig(); d.Policy != "prefixmesh" || d.LoadFactor != 1.25 || d.Tokenizer != "cl100k_base" ||
		d.RaftListen != "127.0.0.1:7000" || d.RaftDir != defaultRaftDir(d.NodeID) || d.RaftBootstrapExpect != 1 || !d.RaftVoter {
		t.Fatalf("defaults: %+v", d)
	}
}
