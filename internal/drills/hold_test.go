package drills

import (
	"io"
	"net"
	"testing"
)

// portHold keeps a killed node's ports bound while it is down, so that nothing else on the
// machine takes them before it restarts on them: `go test ./...` runs other packages beside the
// drills, and their clients' ephemeral ports come from the same range as the nodes' :0 ones.
type portHold []io.Closer

// hold binds addr over TCP, and over UDP too when udp is set (memberlist uses both). A port
// already taken is logged and left alone: the restart then reports the clash itself.
func (h *portHold) hold(t *testing.T, addr string, udp bool) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Logf("hold %s/tcp while the node is down: %v", addr, err)
	} else {
		*h = append(*h, ln)
	}
	if !udp {
		return
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Logf("hold %s/udp while the node is down: %v", addr, err)
		return
	}
	*h = append(*h, pc)
}

// release unbinds every held port, just before the node restarts on them.
func (h *portHold) release() {
	for _, c := range *h {
		_ = c.Close()
	}
	*h = nil
}
