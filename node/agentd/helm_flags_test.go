package agentd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelmFlags checks that --validate-only accepts exactly the flags the Helm chart passes
// (deploy/helm/prefixmesh: the node.flags ConfigMap, read with --config, plus the DaemonSet's
// args), for both engines, with and without TLS and gossip keys.
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
	// The HTTP listener (metrics, health, the simulated engine) is plaintext behind the chart's
	// NetworkPolicy; NodeCache is plaintext only without TLS (plain), with the flag that says so.
	mirrorNode := []string{"--grpc-listen=:7070", "--http-listen=:8080", "--insecure-http", "--model=prefixmesh-sim", "--block-size=16"}
	plain := []string{"--insecure-grpc"}
	node := append(append([]string(nil), mirrorNode...), "--kv-blocks=32768") // the chart passes --kv-blocks only to sim and external
	tls := []string{"--tls-cert=" + cert, "--tls-key=" + key, "--tls-client-ca=" + ca}
	join := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	cases := map[string][]string{
		"sim, insecure gossip":   join(common, []string{"--insecure-gossip"}, plain, node, []string{"--engine=sim"}),
		"sim, gossip key":        join(common, []string{"--gossip-key-file=" + gossipKey}, plain, node, []string{"--engine=sim"}),
		"external, key and TLS":  join(common, []string{"--gossip-key-file=" + gossipKey}, tls, node, []string{"--engine=external", "--engine-url=http://127.0.0.1:8000"}),
		"sim, pins from address": join(common, []string{"--insecure-gossip"}, plain, node, []string{"--pins-addr=prefixmesh-router:7080"}),
		"vllm, key and TLS": join(common, []string{"--gossip-key-file=" + gossipKey}, tls, mirrorNode, []string{"--engine=vllm", "--engine-url=http://10.0.0.7:8000",
			"--kv-events-listen=tcp://127.0.0.1:5557", "--kv-events-replay=tcp://127.0.0.1:5657", "--kv-events-topic=", "--dp-size=1", "--state-dir=/var/lib/prefixmesh/node"}),
		"sglang, no replay, dialling": join(common, []string{"--insecure-gossip"}, plain, mirrorNode, []string{"--engine=sglang", "--engine-url=http://10.0.0.7:30000",
			"--kv-events=tcp://127.0.0.1:5557", "--kv-events-replay=", "--kv-events-topic=kv@", "--dp-size=2"}),
		// A node pool's own args (node.pools): its role and KV connector.
		"sglang prefill pool": join(common, []string{"--insecure-gossip"}, plain, mirrorNode, []string{"--engine=sglang", "--engine-url=http://10.0.0.7:8000",
			"--kv-events-listen=tcp://127.0.0.1:5557", "--role=prefill", "--kv-connector=sglang", "--sglang-bootstrap-port=8998"}),
		"vllm decode pool": join(common, []string{"--insecure-gossip"}, plain, mirrorNode, []string{"--engine=vllm", "--engine-url=http://10.0.0.7:8000",
			"--kv-events-listen=tcp://127.0.0.1:5557", "--role=decode", "--kv-connector=nixl"}),
	}
	args := []string{"--node-id=gpu-node-7"}
	for name, flags := range cases {
		t.Run(name, func(t *testing.T) {
			conf := filepath.Join(t.TempDir(), "node.flags")
			if err := os.WriteFile(conf, []byte(strings.Join(flags, "\n")+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, line := range [][]string{
				append([]string{"--validate-only", "--config=" + conf}, args...),
				append(append([]string{"--validate-only"}, flags...), args...),
			} {
				var out, errb bytes.Buffer
				if code := agentMain(line, &out, &errb); code != 0 || out.String() != "ok\n" {
					t.Fatalf("%v: exit %d, %q %q", line, code, out.String(), errb.String())
				}
			}
		})
	}
	var out, errb bytes.Buffer
	if code := agentMain([]string{"--validate-only", "--pins-addr=nocolon"}, &out, &errb); code != 2 {
		t.Fatalf("--pins-addr without a port: exit %d, want 2", code)
	}
}
