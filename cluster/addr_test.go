package cluster

import (
	"net"
	"testing"
)

func TestReachableAddr(t *testing.T) {
	if got := ReachableAddr(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7}, "x"); got != "127.0.0.1:7" {
		t.Errorf("bound address: %q", got)
	}
	if got := ReachableAddr(&net.TCPAddr{IP: net.IPv6unspecified, Port: 7070}, "10.1.2.3"); got != "10.1.2.3:7070" {
		t.Errorf("wildcard with advertise: %q", got)
	}
	if got := ReachableAddr(&net.TCPAddr{IP: net.IPv4zero, Port: 7070}, ""); got == "" || got == "0.0.0.0:7070" || got == "[::]:7070" {
		t.Errorf("wildcard without advertise: %q", got)
	}
	if got := ReachableAddr(&net.UnixAddr{Name: "/tmp/s", Net: "unix"}, ""); got != "" {
		t.Errorf("unix socket: %q", got)
	}
}
