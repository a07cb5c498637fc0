package pins

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is raft's StreamLayer over TCP, optionally TLS: the listener wraps accepted
// connections in tls.Server with serverTLS (mTLS when it requires client certificates), and Dial
// uses tls.Dial with clientTLS. Without TLS it is what raft.NewTCPTransport builds.
type streamLayer struct {
	net.Listener
	advertise net.Addr
	clientTLS *tls.Config
}

var _ raft.StreamLayer = (*streamLayer)(nil)

// newStreamLayer listens on bind ("host:0" picks a free port) and advertises advertise, or the
// listener's own address when advertise is empty. An unspecified advertised IP (0.0.0.0) is
// refused: other members could not dial it.
func newStreamLayer(bind, advertise string, serverTLS, clientTLS *tls.Config) (*streamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	var adv net.Addr = ln.Addr()
	if advertise != "" {
		if adv, err = net.ResolveTCPAddr("tcp", advertise); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("resolve advertise address: %w", err)
		}
	}
	if tcp, ok := adv.(*net.TCPAddr); !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
		_ = ln.Close()
		return nil, fmt.Errorf("advertise address %v is not dialable; set RaftAdvertise", adv)
	}
	if serverTLS != nil {
		ln = tls.NewListener(ln, serverTLS)
	}
	return &streamLayer{Listener: ln, advertise: adv, clientTLS: clientTLS}, nil
}

// Addr returns the advertised address.
func (l *streamLayer) Addr() net.Addr { return l.advertise }

// Dial connects to another member's raft transport.
func (l *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if l.clientTLS == nil {
		return d.Dial("tcp", string(address))
	}
	conn, err := tls.DialWithDialer(d, "tcp", string(address), l.clientTLS)
	if err != nil {
		return nil, err
	}
	return conn, nil
}
