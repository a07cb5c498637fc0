package frontdoor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// Request bodies are read into pooled buffers, one pool per power-of-two size class, so a
// request allocates nothing that grows with its prompt to hold the body (BenchmarkPromptGrowth).
const (
	// minPooledBodyBits is the smallest class, 4 KiB: a short chat body.
	minPooledBodyBits = 12
	// maxPooledBodyBits is the largest class, 1 MiB (a 128k-token id prompt is ~800 KB):
	// larger bodies, up to Config.MaxBodyBytes, are allocated per request rather than kept in
	// a pool that would hold several MiB per idle class.
	maxPooledBodyBits = 20
)

var bodyPools [maxPooledBodyBits - minPooledBodyBits + 1]sync.Pool

// bodyClass is the pool index for an n-byte body, or -1 when n is above the largest class.
func bodyClass(n int) int {
	c := max(bits.Len(uint(n-1)), minPooledBodyBits) - minPooledBodyBits
	if c >= len(bodyPools) {
		return -1
	}
	return c
}

// reqBody is a request body shared by the handler and every upstream request that re-sends it
// (the first attempt, a retry, the engine tokenizer). Its buffer goes back to its pool only when
// all of them let go: the handler's reference ends when it returns, an upstream request's when
// the Transport closes the request body, which it may do after RoundTrip returned.
type reqBody struct {
	b     []byte
	buf   *[]byte // the pooled buffer b is in; nil when b is not pooled
	class int
	refs  atomic.Int32
	// A spliced body (a batch's prompt) reads as b, then rest[0], then rest[1]: views into
	// parent's bytes, on which it holds a reference until its own last one is dropped.
	rest   [2][]byte
	parent *reqBody
}

// newReqBody holds b (not pooled) with one reference, the caller's.
func newReqBody(b []byte) *reqBody {
	rb := &reqBody{b: b}
	rb.refs.Store(1)
	return rb
}

// newSplicedBody reads as parent's bytes with parent.b[cut0:cut1] replaced by
// parent.b[keep0:keep1], without copying: one prompt of a batch is the batch's body with its
// prompt value replaced by that prompt's JSON. It takes a reference on parent and holds one of
// its own, the caller's.
func newSplicedBody(parent *reqBody, cut0, cut1, keep0, keep1 int) *reqBody {
	parent.refs.Add(1)
	rb := &reqBody{b: parent.b[:cut0], rest: [2][]byte{parent.b[keep0:keep1], parent.b[cut1:]}, parent: parent}
	rb.refs.Store(1)
	return rb
}

// size is the body's length in bytes.
func (rb *reqBody) size() int { return len(rb.b) + len(rb.rest[0]) + len(rb.rest[1]) }

// release drops one reference; the last returns the buffer to its pool (or, for a spliced
// body, its reference on the parent).
func (rb *reqBody) release() {
	if rb.refs.Add(-1) != 0 {
		return
	}
	if rb.buf != nil {
		bodyPools[rb.class].Put(rb.buf)
		rb.buf, rb.b = nil, nil
	}
	if rb.parent != nil {
		rb.b, rb.rest = nil, [2][]byte{}
		rb.parent.release()
	}
}

// open is a reader of the body holding a reference until it is closed. Only a holder of a
// reference may call it (the handler, during the upstream request).
func (rb *reqBody) open() io.ReadCloser {
	rb.refs.Add(1)
	r := &bodyReader{rb: rb}
	r.r.Reset(rb.b)
	return r
}

// upstreamRequest sets req's body to rb, with GetBody for the Transport's own retries on a
// connection that closed under it.
func (rb *reqBody) upstreamRequest(req *http.Request) {
	req.Body = rb.open()
	req.ContentLength = int64(rb.size())
	req.GetBody = func() (io.ReadCloser, error) { return rb.open(), nil }
}

// bodyReader reads a reqBody. The Transport may close a request body from another goroutine
// while its writer is still reading it, so Read and Close take mu: the buffer never goes back
// to the pool during a Read, and a Read after Close sees the end. (No WriteTo: it would hold mu
// across a blocking write, and net/http wraps the body in an io.LimitReader anyway.)
type bodyReader struct {
	mu     sync.Mutex // guards r, next and closed
	r      bytes.Reader
	next   int // the index in rb.rest of the part r reads after its current one
	rb     *reqBody
	closed bool
}

func (r *bodyReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, io.EOF
	}
	for {
		n, err := r.r.Read(p)
		if err != io.EOF || r.next == len(r.rb.rest) {
			return n, err
		}
		r.r.Reset(r.rb.rest[r.next])
		r.next++
		if n > 0 {
			return n, nil
		}
	}
}

func (r *bodyReader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		r.r.Reset(nil)
		r.rb.release()
	}
	return nil
}

// readBodyPooled reads the whole body, at most limit bytes (more is an *http.MaxBytesError),
// into a pooled buffer when the Content-Length is known and within the largest class.
func readBodyPooled(w http.ResponseWriter, r *http.Request, limit int64) (*reqBody, error) {
	n := r.ContentLength
	if n <= 0 || n > limit {
		b, err := readBody(w, r, limit)
		if err != nil {
			return nil, err
		}
		return newReqBody(b), nil
	}
	c := bodyClass(int(n))
	if c < 0 {
		b, err := readBody(w, r, limit)
		if err != nil {
			return nil, err
		}
		return newReqBody(b), nil
	}
	bp, _ := bodyPools[c].Get().(*[]byte)
	if bp == nil {
		b := make([]byte, 1<<(c+minPooledBodyBits))
		bp = &b
	}
	buf := (*bp)[:n]
	if _, err := io.ReadFull(http.MaxBytesReader(w, r.Body, limit), buf); err != nil {
		bodyPools[c].Put(bp)
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("the body ended before its Content-Length of %d bytes: %w", n, err)
		}
		return nil, err
	}
	rb := &reqBody{b: buf, buf: bp, class: c}
	rb.refs.Store(1)
	return rb, nil
}

// copyConn is an upstream connection whose ReadFrom (how net/http writes a request body) copies
// through a pooled buffer: net.TCPConn's generic ReadFrom allocates a new buffer of up to 32 KiB
// for every request body it cannot splice, and a request body never can be.
type copyConn struct{ net.Conn }

func (c copyConn) ReadFrom(r io.Reader) (int64, error) {
	bp := relayBufs.Get().(*[]byte)
	defer relayBufs.Put(bp)
	return io.CopyBuffer(writerOnly{c.Conn}, r, *bp)
}

// writerOnly hides every method of its writer but Write (io.CopyBuffer would otherwise call
// the connection's own ReadFrom).
type writerOnly struct{ io.Writer }
