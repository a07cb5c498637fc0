// Package connstats counts a gRPC server's connections that never became gRPC connections:
// garbage, port scanners, another protocol or a failed TLS handshake. grpc-go drops those without
// a word at its default log level, so without this an operator cannot tell a port being probed
// from a quiet one (faults outsiders can trigger are counted, not logged per event).
// Wrap the listener with Listener and pass StatsHandler to grpc.NewServer: a connection the
// server accepted is "established" once grpc-go has read its HTTP/2 preface (the stats handler
// sees it) and "refused" if it closes before that.
package connstats

import (
	"context"
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"
)

// Counter counts one server's connections by outcome.
type Counter struct {
	mu      sync.Mutex          // guards pending
	pending map[string]struct{} // remote addresses accepted and not yet established

	accepted, established, refused prometheus.Counter
}

// New registers prefixmesh_grpc_connections_total{outcome} on reg (nil: unregistered).
func New(reg prometheus.Registerer) (*Counter, error) {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixmesh_grpc_connections_total",
		Help: "Connections the gRPC listener accepted, by outcome: accepted (all), established (a gRPC connection), refused (closed before one: garbage, another protocol, a failed TLS handshake).",
	}, []string{"outcome"})
	if reg != nil {
		if err := reg.Register(v); err != nil {
			return nil, err
		}
	}
	return &Counter{pending: map[string]struct{}{}, accepted: v.WithLabelValues("accepted"),
		established: v.WithLabelValues("established"), refused: v.WithLabelValues("refused")}, nil
}

// Listener wraps l so that every accepted connection is counted. Only TCP listeners are
// wrapped: the peers of a Unix socket have no distinct addresses to match on.
func (c *Counter) Listener(l net.Listener) net.Listener {
	if l.Addr().Network() != "tcp" {
		return l
	}
	return listener{Listener: l, c: c}
}

// StatsHandler returns the grpc.StatsHandler that marks connections established.
func (c *Counter) StatsHandler() stats.Handler { return handler{c} }

type listener struct {
	net.Listener
	c *Counter
}

func (l listener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.c.accepted.Inc()
	key := conn.RemoteAddr().String()
	l.c.mu.Lock()
	l.c.pending[key] = struct{}{}
	l.c.mu.Unlock()
	return &trackedConn{Conn: conn, c: l.c, key: key}, nil
}

type trackedConn struct {
	net.Conn
	c    *Counter
	key  string
	once sync.Once
}

func (t *trackedConn) Close() error {
	t.once.Do(func() {
		t.c.mu.Lock()
		_, pending := t.c.pending[t.key]
		delete(t.c.pending, t.key)
		t.c.mu.Unlock()
		if pending {
			t.c.refused.Inc()
		}
	})
	return t.Conn.Close()
}

type handler struct{ c *Counter }

func (h handler) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if info.RemoteAddr != nil {
		key := info.RemoteAddr.String()
		h.c.mu.Lock()
		_, pending := h.c.pending[key]
		delete(h.c.pending, key)
		h.c.mu.Unlock()
		if pending {
			h.c.established.Inc()
		}
	}
	return ctx
}

func (handler) HandleConn(context.Context, stats.ConnStats)                     {}
func (handler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (handler) HandleRPC(context.Context, stats.RPCStats)                       {}
