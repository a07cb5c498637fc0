package agentd

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/node/kvevents"
	"github.com/prefixmesh/prefixmesh/node/simengine"
)

func TestDefaultConfigIsValid(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
}

func TestValidateOnly(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := agentMain([]string{"--validate-only", "--engine=external", "--engine-url=http://engine:8000", "--grpc-listen=unix:///tmp/x.sock"}, &stdout, &stderr)
	if code != 0 || stdout.String() != "ok\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and \"ok\"", code, stdout.String(), stderr.String())
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := agentMain([]string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	for _, flag := range []string{"-grpc-listen", "-http-listen", "-node-id", "-block-size", "-kv-blocks", "-engine", "-engine-url",
		"-model", "-tls-cert", "-tls-key", "-tls-client-ca", "-log-level", "-drain-timeout", "-validate-only", "-addr-file",
		"-sim-prefill-tokens-per-s", "-sim-decode-tokens-per-s", "-sim-token-budget", "-sim-max-concurrent", "-sim-max-queue", "-sim-tokenizer", "-config", "-pins-addr",
		"-kv-events", "-kv-events-listen", "-kv-events-replay", "-kv-events-topic", "-dp-size", "-sim-kv-events",
		"-role", "-kv-connector", "-sglang-bootstrap-port", "-kv-peer-addr", "-sim-kv-side-channel", "-sim-kv-side-channel-host", "-sim-kv-lease",
		"-sim-kv-transfer-tokens-per-s", "-sim-kv-load-failure-policy", "-sim-kv-recompute-threshold"} {
		if !strings.Contains(stderr.String(), flag) {
			t.Errorf("--help does not mention %s", flag)
		}
	}
}

func TestFlagsMapToConfig(t *testing.T) {
	cfg, err := parseConfig([]string{"--grpc-listen=0.0.0.0:9", "--insecure-grpc", "--tls-no-client-auth", "--http-listen=:8", "--insecure-http", "--node-id=n7", "--block-size=32",
		"--kv-blocks=100", "--model=m", "--log-level=debug", "--drain-timeout=3s", "--sim-prefill-tokens-per-s=5",
		"--sim-decode-tokens-per-s=6", "--sim-token-budget=2048", "--sim-max-concurrent=7", "--sim-max-queue=0", "--sim-tokenizer=bytes",
		"--sim-cpu-blocks=96", "--sim-cpu-load-tokens-per-s=2e5", "--sim-cpu-chunk-blocks=16",
		"--role=prefill", "--kv-connector=sglang", "--sglang-bootstrap-port=9001", "--kv-peer-addr=10.1.2.3:5601",
		"--sim-kv-side-channel=0.0.0.0:5600", "--sim-kv-side-channel-host=10.1.2.3", "--sim-kv-lease=45s",
		"--sim-kv-transfer-tokens-per-s=4e5", "--sim-kv-load-failure-policy=fail", "--sim-kv-recompute-threshold=64"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.GRPCListen, want.HTTPListen, want.NodeID, want.BlockSize, want.KVBlocks = "0.0.0.0:9", ":8", "n7", 32, 100
	want.InsecureGRPC, want.TLSNoClientAuth, want.InsecureHTTP = true, true, true
	want.Model, want.LogLevel, want.DrainTimeout = "m", "debug", 3*time.Second
	want.Sim.PrefillTokensPerSec, want.Sim.DecodeTokensPerSec, want.Sim.MaxConcurrent, want.Sim.MaxQueue = 5, 6, 7, 0
	want.Sim.TokenBudget = 2048
	want.Sim.Tokenizer = "bytes"
	want.Sim.CPUBlocks, want.Sim.CPULoadTokensPerSec, want.Sim.CPUChunkBlocks = 96, 2e5, 16
	want.Role, want.KVConnector, want.SGLangBootstrapPort, want.KVPeerAddr = "prefill", "sglang", 9001, "10.1.2.3:5601"
	want.Sim.KVSideChannel, want.Sim.KVSideChannelHost, want.Sim.KVLease = "0.0.0.0:5600", "10.1.2.3", 45*time.Second
	want.Sim.KVTransferTokensPerSec, want.Sim.KVLoadFailurePolicy, want.Sim.KVRecomputeThreshold = 4e5, "fail", 64
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("parsed %+v\nwant   %+v", cfg, want)
	}
}

// The real-engine flags map to the follower's configuration; without --model the
// model is left for the engine to name.
func TestEngineFlagsMapToConfig(t *testing.T) {
	cfg, err := parseConfig([]string{"--engine=vllm", "--engine-url=http://127.0.0.1:8000", "--kv-events-listen=tcp://0.0.0.0:5557",
		"--kv-events-replay=tcp://127.0.0.1:5558", "--kv-events-topic=kv@", "--dp-size=2",
		"--sim-kv-events=tcp://127.0.0.1:1", "--sim-kv-events-layout=array", "--sim-kv-events-hashes=bytes"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.kvEventsConfig()
	if cfg.Model != "" || !k.Listen || k.Endpoint != "tcp://0.0.0.0:5557" || k.Replay != "tcp://127.0.0.1:5558" || k.Topic != "kv@" || k.DPSize != 2 ||
		cfg.Sim.KVEvents != "tcp://127.0.0.1:1" || cfg.Sim.KVEventsLayout != "array" || cfg.Sim.KVEventsHashes != "bytes" {
		t.Fatalf("parsed %+v → %+v", cfg, k)
	}
	if k.UnremovedTierTTL != kvevents.DefaultUnremovedTierTTL {
		t.Fatalf("unremoved-tier TTL %v, want the mirror's default %v", k.UnremovedTierTTL, kvevents.DefaultUnremovedTierTTL)
	}
	cfg, err = parseConfig([]string{"--engine=sglang", "--engine-url=http://e:30000", "--model=m"}, &bytes.Buffer{})
	if err != nil || cfg.Model != "m" || cfg.kvEventsConfig().Endpoint != "tcp://127.0.0.1:5557" {
		t.Fatalf("sglang: %+v %v", cfg, err)
	}
	// --unremoved-tier-ttl reaches the mirror the follower fills (CacheMirror.SetUnremovedTTL):
	// a CPU copy from a tier that never removed ages out after it, or never with 0.
	for flag, aged := range map[string]int{"--unremoved-tier-ttl=90s": 1, "--unremoved-tier-ttl=0": 0} {
		cfg, err = parseConfig([]string{"--engine=vllm", "--engine-url=http://e:8000", flag}, &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%s: %v", flag, err)
		}
		mir := kvevents.NewCacheMirror(4)
		now := time.Unix(1000, 0)
		mir.SetClock(func() time.Time { return now })
		if _, err := kvevents.NewFollower(cfg.kvEventsConfig(), mir, nil, nil); err != nil {
			t.Fatalf("%s: follower: %v", flag, err)
		}
		mir.Apply(0, &kvevents.Event{Kind: kvevents.KindStored, Tier: kvevents.TierCPU, Hashes: []uint64{7}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 4})
		now = now.Add(91 * time.Second)
		if got := mir.Expire(); got != aged {
			t.Errorf("%s: %d copies aged out after 91 s, want %d", flag, got, aged)
		}
	}
}

// Flags a mode would ignore are refused at start, each with the reason.
func TestRefuseIgnoredFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine=sim", "--kv-events=tcp://127.0.0.1:5557"}, "--kv-events: only --engine=vllm|sglang"},
		{[]string{"--kv-events-replay=tcp://127.0.0.1:5657"}, "--kv-events-replay: only --engine=vllm|sglang"},
		{[]string{"--engine=external", "--engine-url=http://e:1", "--dp-size=2"}, "--dp-size: only --engine=vllm|sglang"},
		{[]string{"--state-dir=/tmp/x"}, "--state-dir: only --engine=vllm|sglang"},
		{[]string{"--unremoved-tier-ttl=1m"}, "--unremoved-tier-ttl: only --engine=vllm|sglang"},
		{[]string{"--engine=vllm", "--engine-url=http://e:1", "--kv-blocks=10"}, "--kv-blocks: the simulated engine's pool size"},
		{[]string{"--engine=sglang", "--engine-url=http://e:1", "--kv-events=tcp://127.0.0.1:5557", "--kv-events-listen=tcp://127.0.0.1:5557"},
			"--kv-events and --kv-events-listen: give one"},
		{[]string{"--engine=vllm", "--engine-url=http://e:1", "--kv-events=tcp://127.0.0.1:5557", "--kv-events-replay=tcp://127.0.0.1:5558", "--dp-size=2"},
			"ranks use ports 5557-5558 and 5558-5559, which overlap"},
	} {
		_, err := parseConfig(c.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want %q", c.args, err, c.want)
		}
	}
	// What the modes do read still parses.
	for _, args := range [][]string{
		{"--engine=sim", "--kv-blocks=10", "--sim-kv-events=tcp://127.0.0.1:0"},
		{"--engine=vllm", "--engine-url=http://e:1", "--kv-events-listen=tcp://127.0.0.1:5557", "--kv-events-replay=tcp://127.0.0.1:5657", "--dp-size=4"},
	} {
		if _, err := parseConfig(args, &bytes.Buffer{}); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// The serving role and connector as the node gossips them: the default is a whole-request node
// without a connector, and the bootstrap port travels only with SGLang's connector.
func TestServingFromFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		role cluster.ServingRole
		conn cluster.KVConnector
		port uint16
	}{
		{nil, cluster.ServeBoth, cluster.KVConnectorNone, 0},
		{[]string{"--role=decode", "--kv-connector=nixl"}, cluster.ServeDecode, cluster.KVConnectorNIXL, 0},
		{[]string{"--role=prefill", "--kv-connector=sglang"}, cluster.ServePrefill, cluster.KVConnectorSGLang, 8998},
		{[]string{"--role=both", "--kv-connector=none"}, cluster.ServeBoth, cluster.KVConnectorNone, 0},
	} {
		cfg, err := parseConfig(c.args, &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if role, conn, port := cfg.serving(); role != c.role || conn != c.conn || port != c.port {
			t.Errorf("%v: serving %v %v %d, want %v %v %d", c.args, role, conn, port, c.role, c.conn, c.port)
		}
	}
}

func TestConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.flags")
	if err := os.WriteFile(path, []byte("# from a ConfigMap\n--node-id=from-file\nblock-size=64\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseConfig([]string{"--config", path, "--block-size=32"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeID != "from-file" || cfg.BlockSize != 32 {
		t.Fatalf("node id %q block size %d; want from-file and 32 (command line wins)", cfg.NodeID, cfg.BlockSize)
	}
}

// TestInvalidFlags checks that every invalid setting is refused with exit code 2 and a message
// naming the flag.
func TestInvalidFlags(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--grpc-listen=nohostport"}, "--grpc-listen"},
		{[]string{"--grpc-listen=unix://relative.sock"}, "--grpc-listen"},
		{[]string{"--http-listen=unix:///tmp/h.sock"}, "--http-listen"},
		{[]string{"--node-id="}, "--node-id"},
		{[]string{"--kv-peer-addr=5600"}, "--kv-peer-addr"},
		{[]string{"--kv-peer-addr=0.0.0.0:5600"}, "--kv-peer-addr"},
		{[]string{"--kv-peer-addr=host:0"}, "--kv-peer-addr"},
		{[]string{"--node-id=" + strings.Repeat("x", maxNodeID+1)}, "--node-id"},
		{[]string{"--block-size=0"}, "--block-size"},
		{[]string{"--block-size=4097"}, "--block-size"},
		{[]string{"--kv-blocks=0"}, "--kv-blocks"},
		{[]string{"--model="}, "--model"},
		{[]string{"--drain-timeout=0s"}, "--drain-timeout"},
		{[]string{"--log-level=loud"}, "--log-level"},
		{[]string{"--engine=tgi"}, "--engine"},
		{[]string{"--engine=vllm"}, "--engine-url"},
		{[]string{"--engine=vllm", "--engine-url=http://e", "--kv-events=udp://x:1"}, "--kv-events"},
		{[]string{"--engine=vllm", "--engine-url=http://e", "--kv-events-replay=x:1"}, "--kv-events-replay"},
		{[]string{"--engine=sglang", "--engine-url=http://e", "--dp-size=0"}, "--dp-size"},
		{[]string{"--sim-kv-events-layout=yaml"}, "--sim-kv-events-layout"},
		{[]string{"--sim-kv-events-hashes=str"}, "--sim-kv-events-hashes"},
		{[]string{"--sim-kv-events-replay=tcp://127.0.0.1:1"}, "--sim-kv-events-replay"},
		{[]string{"--engine=external"}, "--engine-url"},
		{[]string{"--engine=external", "--engine-url=ftp://x"}, "--engine-url"},
		{[]string{"--tls-cert=" + missing}, "--tls-cert and --tls-key"},
		{[]string{"--tls-cert=" + missing, "--tls-key=" + missing}, "--tls-cert"},
		{[]string{"--tls-client-ca=" + missing}, "--tls-client-ca"},
		{[]string{"--sim-prefill-tokens-per-s=0"}, "--sim-prefill-tokens-per-s"},
		{[]string{"--sim-decode-tokens-per-s=-1"}, "--sim-decode-tokens-per-s"},
		{[]string{"--sim-max-concurrent=0"}, "--sim-max-concurrent"},
		{[]string{"--sim-max-queue=-1"}, "--sim-max-queue"},
		{[]string{"--sim-token-budget=0"}, "--sim-token-budget 0: must be positive"},
		{[]string{"--sim-cpu-blocks=-1"}, "--sim-cpu-blocks -1: must be in [0,"},
		{[]string{"--sim-cpu-blocks=" + strconv.Itoa(simengine.MaxCPUBlocks+1)}, "--sim-cpu-blocks"},
		{[]string{"--sim-cpu-chunk-blocks=0"}, "--sim-cpu-chunk-blocks 0: must be positive"},
		{[]string{"--sim-cpu-blocks=100", "--sim-cpu-chunk-blocks=16"}, "--sim-cpu-blocks 100: must be a multiple of --sim-cpu-chunk-blocks 16"},
		{[]string{"--sim-cpu-blocks=64", "--sim-cpu-load-tokens-per-s=0"}, "--sim-cpu-load-tokens-per-s 0: must be positive"},
		{[]string{"--engine=vllm", "--engine-url=http://e", "--unremoved-tier-ttl=-1s"}, "--unremoved-tier-ttl -1s: must not be negative"},
		{[]string{"--role=encode"}, "--role"},
		{[]string{"--role="}, "--role"},
		{[]string{"--kv-connector=mooncake"}, "--kv-connector"},
		{[]string{"--kv-connector=sglang", "--sglang-bootstrap-port=0"}, "--sglang-bootstrap-port"},
		{[]string{"--kv-connector=sglang", "--sglang-bootstrap-port=65536"}, "--sglang-bootstrap-port"},
		{[]string{"--kv-connector=nixl", "--sglang-bootstrap-port=9000"}, "--sglang-bootstrap-port: only --kv-connector=sglang"},
		{[]string{"--sim-kv-lease=0s"}, "--sim-kv-lease 0s: must be positive"},
		{[]string{"--sim-kv-transfer-tokens-per-s=0"}, "--sim-kv-transfer-tokens-per-s 0: must be positive"},
		{[]string{"--sim-kv-load-failure-policy=retry"}, "--sim-kv-load-failure-policy \"retry\": must be recompute or fail"},
		{[]string{"--sim-kv-recompute-threshold=-1"}, "--sim-kv-recompute-threshold -1: must not be negative"},
		{[]string{"--sim-kv-side-channel=5600"}, "--sim-kv-side-channel \"5600\": want host:port"},
		{[]string{"--sim-kv-side-channel=:5600", "--insecure-http"}, "set --sim-kv-side-channel-host"},
		{[]string{"--sim-kv-side-channel=10.0.0.7:5600"}, "--sim-kv-side-channel 10.0.0.7:5600: simulated engine's KV side channel would serve plaintext on a non-loopback address: listen on loopback, or pass --insecure-http"},
		{[]string{"--sim-kv-side-channel=", "--sim-kv-side-channel-host=h"}, "--sim-kv-side-channel-host: needs --sim-kv-side-channel"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"stray-argument"}, "unexpected arguments"},
	} {
		var stdout, stderr bytes.Buffer
		code := agentMain(append(tc.args, "--validate-only"), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 naming %s", tc.args, code, stderr.String(), tc.want)
		}
	}
	if _, err := parseConfig([]string{"--block-size=0"}, &bytes.Buffer{}); !errors.Is(err, errConfig) {
		t.Errorf("parseConfig error %v does not wrap errConfig", err)
	}
}
