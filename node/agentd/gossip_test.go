package agentd

import (
	"io"
	"net"
	"testing"

	"github.com/prefixmesh/prefixmesh/cluster"
)

func TestGossipFlags(t *testing.T) {
	cfg, err := parseConfig(nil, io.Discard)
	if err != nil || cfg.Gossip.Listen != "" {
		t.Fatalf("default: standalone node expected: %v %+v", err, cfg.Gossip)
	}
	if _, err := parseConfig([]string{"--gossip-listen", "127.0.0.1:0"}, io.Discard); err == nil {
		t.Fatal("gossip without a key or --insecure-gossip accepted")
	}
	cfg, err = parseConfig([]string{"--gossip-listen", "127.0.0.1:0", "--insecure-gossip", "--join", "r:7946", "--join", "dns+srv:_g._udp.svc"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Gossip.Join) != 2 || !cfg.Gossip.Insecure {
		t.Fatalf("gossip flags: %+v", cfg.Gossip)
	}
}

func TestReachableAddr(t *testing.T) {
	for _, c := range []struct {
		addr      net.Addr
		advertise string
		want      string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7070}, "", "127.0.0.1:7070"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 7070}, "10.1.2.3", "10.1.2.3:7070"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}, "10.0.0.9", "10.0.0.9:8080"}, // ":8080" binds [::]
		{&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, "", ""},
	} {
		if got := cluster.ReachableAddr(c.addr, c.advertise); got != c.want {
			t.Errorf("ReachableAddr(%v, %q) = %q, want %q", c.addr, c.advertise, got, c.want)
		}
	}
}
