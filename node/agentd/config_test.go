package agentd

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
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
		"-sim-prefill-tokens-per-s", "-sim-decode-tokens-per-s", "-sim-max-concurrent", "-sim-max-queue", "-sim-tokenizer", "-config", "-pins-addr"} {
		if !strings.Contains(stderr.String(), flag) {
			t.Errorf("--help does not mention %s", flag)
		}
	}
}

func TestFlagsMapToConfig(t *testing.T) {
	cfg, err := parseConfig([]string{"--grpc-listen=0.0.0.0:9", "--http-listen=:8", "--node-id=n7", "--block-size=32",
		"--kv-blocks=100", "--model=m", "--log-level=debug", "--drain-timeout=3s", "--sim-prefill-tokens-per-s=5",
		"--sim-decode-tokens-per-s=6", "--sim-max-concurrent=7", "--sim-max-queue=0", "--sim-tokenizer=bytes"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.GRPCListen, want.HTTPListen, want.NodeID, want.BlockSize, want.KVBlocks = "0.0.0.0:9", ":8", "n7", 32, 100
	want.Model, want.LogLevel, want.DrainTimeout = "m", "debug", 3*time.Second
	want.Sim = SimConfig{PrefillTokensPerSec: 5, DecodeTokensPerSec: 6, MaxConcurrent: 7, MaxQueue: 0, Tokenizer: "bytes"}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("parsed %+v\nwant   %+v", cfg, want)
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
		{[]string{"--node-id=" + strings.Repeat("x", maxNodeID+1)}, "--node-id"},
		{[]string{"--block-size=0"}, "--block-size"},
		{[]string{"--block-size=4097"}, "--block-size"},
		{[]string{"--kv-blocks=0"}, "--kv-blocks"},
		{[]string{"--model="}, "--model"},
		{[]string{"--drain-timeout=0s"}, "--drain-timeout"},
		{[]string{"--log-level=loud"}, "--log-level"},
		{[]string{"--engine=vllm"}, "--engine"},
		{[]string{"--engine=external"}, "--engine-url"},
		{[]string{"--engine=external", "--engine-url=ftp://x"}, "--engine-url"},
		{[]string{"--tls-cert=" + missing}, "--tls-cert and --tls-key"},
		{[]string{"--tls-cert=" + missing, "--tls-key=" + missing}, "--tls-cert"},
		{[]string{"--tls-client-ca=" + missing}, "--tls-client-ca"},
		{[]string{"--sim-prefill-tokens-per-s=0"}, "--sim-prefill-tokens-per-s"},
		{[]string{"--sim-decode-tokens-per-s=-1"}, "--sim-decode-tokens-per-s"},
		{[]string{"--sim-max-concurrent=0"}, "--sim-max-concurrent"},
		{[]string{"--sim-max-queue=-1"}, "--sim-max-queue"},
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
