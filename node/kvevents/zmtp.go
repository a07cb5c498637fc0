package kvevents

// A guarded TCP transport for go-zeromq/zmq4 (v0.17.0), which the follower's and publisher's
// sockets use instead of the library's plain "tcp" one. It fixes three faults of the library
// without forking it:
//
//   - Frame sizes: zmq4's Conn.read allocates whatever size a frame header declares before
//     reading a byte of it, so one peer declaring a 1 TiB frame takes the process down. Every
//     connection here parses the ZMTP 3 framing it passes up (the 64-byte greeting, then per
//     frame a flags byte and a 1- or 8-byte size, RFC 23/ZMTP) and closes the connection,
//     failing that read, at a declared size over maxFrameBytes: zmq4 never sees the header.
//   - Handshake stalls: zmq4 accepts connections one at a time and runs each handshake in its
//     accept loop without a deadline, so a peer that connects and says nothing stops every later
//     connection (the engine's reconnect among them). A connection must finish its greeting and
//     first command within handshakeTimeout.
//   - Leaked readers: zmq4 reads each connection on a goroutine (qreader.listen) that hands
//     messages to the socket over a 10-message channel with a blocking send; once the socket's
//     user stops calling Recv (an abandoned replay) that goroutine and the messages it holds
//     are stuck for good, even after Close. The connections are registered in the socket's
//     context (connSet), so the owner can close them and drain Recv to the library's last
//     message before closing the socket.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

const (
	// guardedScheme is the zmq4 transport name of the guarded TCP transport.
	guardedScheme = "prefixmesh-tcp"
	// maxFrameBytes bounds one ZMTP frame: a payload at the decoder's cap plus room for the
	// msgpack framing; topic and sequence frames are tiny.
	maxFrameBytes = MaxPayloadBytes + 64<<10
	// handshakeTimeout bounds a connection's greeting and first command (READY).
	handshakeTimeout = 5 * time.Second
	// drainTimeout bounds how long a closing socket waits for the library's readers to hand over
	// their last message; past it the socket is closed anyway.
	drainTimeout = 2 * time.Second
	// zmtpGreeting is the length of a ZMTP 3 greeting.
	zmtpGreeting = 64
)

// ErrFrameTooBig is the read error of a connection whose peer declared a frame over the cap.
var ErrFrameTooBig = errors.New("kvevents: ZMTP frame over the size cap")

func init() {
	if err := zmq4.RegisterTransport(guardedScheme, guardedTransport{}); err != nil {
		panic(err)
	}
}

// zmqEndpoint maps tcp://HOST:PORT to the guarded transport; other schemes pass unchanged.
func zmqEndpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return guardedScheme + "://" + rest
	}
	return ep
}

type guardedTransport struct{}

var plainTCP = transport.New("tcp")

func (guardedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return guard(ctx, c), nil
}

func (guardedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &guardedListener{Listener: l, ctx: ctx}, nil
}

func (guardedTransport) Addr(ep string) (string, error) { return plainTCP.Addr(ep) }

type guardedListener struct {
	net.Listener
	ctx context.Context
}

func (l *guardedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return guard(l.ctx, c), nil
}

// guard wraps c with the frame-size check and the handshake deadline, and registers it in the
// socket context's connSet, if any.
func guard(ctx context.Context, c net.Conn) net.Conn {
	g := &guardedConn{Conn: c, greet: zmtpGreeting, max: maxFrameBytes}
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	if cs, ok := ctx.Value(connSetKey{}).(*connSet); ok {
		cs.add(g)
	}
	return g
}

// guardedConn passes a ZMTP byte stream up while parsing its framing (see the file comment).
// Reads happen on one goroutine at a time (zmq4 reads a connection from one goroutine), so the
// parser state needs no lock; ready is read by connSet from other goroutines.
type guardedConn struct {
	net.Conn
	max   uint64
	greet int     // greeting bytes still to pass
	hdr   [9]byte // the frame header being collected
	hn    int     // its bytes so far
	need  int     // its length: 2, or 9 for a long frame
	cmd   bool    // the frame is a command
	body  uint64  // body bytes still to pass
	hello bool    // the first command's body is being passed: the handshake ends with it
	ready sync.Once
	set   *connSet
}

func (c *guardedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if perr := c.scan(p[:n]); perr != nil {
		_ = c.Conn.Close()
		return 0, perr
	}
	return n, err
}

// scan advances the framing parser over b, failing on a frame over the cap.
func (c *guardedConn) scan(b []byte) error {
	for {
		if c.hello && c.body == 0 && c.hn == 0 {
			c.hello = false
			c.ready.Do(func() {
				_ = c.Conn.SetDeadline(time.Time{})
				if c.set != nil {
					c.set.readied()
				}
			})
		}
		if len(b) == 0 {
			return nil
		}
		switch {
		case c.greet > 0:
			k := min(c.greet, len(b))
			c.greet -= k
			b = b[k:]
		case c.body > 0:
			k := min(c.body, uint64(len(b)))
			c.body -= k
			b = b[k:]
		default:
			if c.hn == 0 {
				c.need = 2
				if b[0]&0x02 != 0 { // LONG
					c.need = 9
				}
				c.cmd = b[0]&0x04 != 0 // COMMAND
			}
			k := min(c.need-c.hn, len(b))
			copy(c.hdr[c.hn:], b[:k])
			c.hn += k
			b = b[k:]
			if c.hn < c.need {
				return nil
			}
			c.hn = 0
			size := uint64(c.hdr[1])
			if c.need == 9 {
				size = binary.BigEndian.Uint64(c.hdr[1:9])
			}
			if size > c.max {
				return fmt.Errorf("%w: the peer %s declared %d bytes (max %d)", ErrFrameTooBig, c.RemoteAddr(), size, c.max)
			}
			c.body = size
			if c.cmd {
				c.hello = true // the deadline goes once this command is read (READY, first)
			}
		}
	}
}

// connSet holds a socket's guarded connections (put in the context the socket is made with).
type connSet struct {
	mu     sync.Mutex
	conns  []*guardedConn
	nready int // connections whose handshake got through (zmq4 then reads them)
}

type connSetKey struct{}

func withConnSet(ctx context.Context, cs *connSet) context.Context {
	return context.WithValue(ctx, connSetKey{}, cs)
}

func (s *connSet) add(c *guardedConn) {
	s.mu.Lock()
	c.set = s
	s.conns = append(s.conns, c)
	s.mu.Unlock()
}

func (s *connSet) readied() {
	s.mu.Lock()
	s.nready++
	s.mu.Unlock()
}

// ready is the number of connections that got through their handshake so far.
func (s *connSet) ready() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nready
}

// closeAll closes every connection: zmq4's reader of each then fails its read and hands one
// last (error) message to the socket. It returns how many there were.
func (s *connSet) closeAll() int {
	s.mu.Lock()
	cs := s.conns
	s.conns = nil
	s.mu.Unlock()
	for _, c := range cs {
		_ = c.Conn.Close()
	}
	return len(cs)
}
