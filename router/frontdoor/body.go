package frontdoor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prefixmesh/prefixmesh/internal/bytebudget"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

var _ requests.Body = (*reqBody)(nil)

// reqBody is a request body shared by the handler and every upstream request that re-sends it
// (the first attempt, a retry, the engine tokenizer). Its buffer goes back to its pool only when
// all of them let go: the handler's reference ends when it returns, an upstream request's when
// the Transport closes the request body, which it may do after RoundTrip returned.
type reqBody struct {
	b     []byte
	buf   *[]byte // the pooled buffer b is in (requests.GetBody); nil when b is not pooled
	class int
	refs  atomic.Int32
	// charged is what the buffer took from budget (the front door's body budget), given back
	// with the buffer; 0 for a body the budget does not count.
	charged int64
	budget  *bytebudget.Budget
	// A spliced body (a batch's prompt) reads as b, then rest[0], then rest[1]: views into
	// parent's bytes, on which it holds a reference until its own last one is dropped.
	rest   [2][]byte
	parent *reqBody
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
		requests.PutBody(rb.class, rb.buf)
		rb.buf, rb.b = nil, nil
	}
	if rb.charged != 0 {
		rb.budget.Give(rb.charged)
		rb.charged = 0
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

// Attach sets req's body to rb, with GetBody for the Transport's own retries on a connection
// that closed under it (requests.Body: the engine tokenizer sends a chat body this way).
func (rb *reqBody) Attach(req *http.Request) {
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

// bodyChunkBytes is how far a request body's buffers may run ahead of the bytes received. A body
// declared longer (or of unknown length) is read a chunk at a time into pooled chunks and joined
// once all of it came, so a client that declares 8 MiB and sends one byte makes the router hold
// one chunk, not 8 MiB. 64 KiB holds nearly every chat or completions body in one buffer (the
// allocation-free fast path) and is a few reads of a TCP connection.
const bodyChunkBytes = 64 << 10

// chunkClass is the pool class of a bodyChunkBytes chunk.
var chunkClass = requests.BodyClass(bodyChunkBytes)

// errBodyBudget is a body that would take the bytes the front door holds across requests over
// the service's body budget, requests.Config.MaxBodyBufferBytes (answered 429).
var errBodyBudget = errors.New("the router holds as many request body bytes as it may")

// readBodyPooled reads the whole body, at most limit bytes (more is an *http.MaxBytesError),
// into pooled buffers charged to budget (a nil budget has no limit): a Take that fails is
// errBodyBudget. A body declared within one chunk is read straight into a buffer of its size
// class; a longer one grows a chunk at a time as its bytes arrive.
func readBodyPooled(w http.ResponseWriter, r *http.Request, limit int64, budget *bytebudget.Budget) (*reqBody, error) {
	n := r.ContentLength
	if n > limit {
		// Refused on its declaration, before a byte is read or a buffer taken.
		return nil, &http.MaxBytesError{Limit: limit}
	}
	if n <= 0 || n > bodyChunkBytes {
		return readChunked(w, r, limit, budget)
	}
	c := requests.BodyClass(int(n))
	size := int64(requests.BodyClassBytes(c))
	if !budget.Take(size) {
		return nil, errBodyBudget
	}
	bp := requests.GetBody(c)
	buf := (*bp)[:n]
	if _, err := io.ReadFull(http.MaxBytesReader(w, r.Body, limit), buf); err != nil {
		requests.PutBody(c, bp)
		budget.Give(size)
		return nil, shortBody(err, n)
	}
	rb := &reqBody{b: buf, buf: bp, class: c, charged: size, budget: budget}
	rb.refs.Store(1)
	return rb, nil
}

// shortBody names a body that ended before its Content-Length.
func shortBody(err error, n int64) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("the body ended before its Content-Length of %d bytes: %w", n, err)
	}
	return err
}

// readChunked reads a body longer than a chunk, or of unknown length, into pooled chunks taken
// from budget one at a time as bytes arrive, then joins them into one buffer of the body's size
// (pooled up to the largest class). While the chunks are joined the body is held twice: bytes
// the client did send, never more than its length plus a chunk beyond.
func readChunked(w http.ResponseWriter, r *http.Request, limit int64, budget *bytebudget.Budget) (*reqBody, error) {
	src := http.MaxBytesReader(w, r.Body, limit)
	var arr [8]*[]byte
	chunks := arr[:0]
	var total int64
	giveBack := func() {
		for _, bp := range chunks {
			requests.PutBody(chunkClass, bp)
		}
		budget.Give(int64(len(chunks)) * bodyChunkBytes)
	}
	for {
		if !budget.Take(bodyChunkBytes) {
			giveBack()
			return nil, errBodyBudget
		}
		bp := requests.GetBody(chunkClass)
		chunks = append(chunks, bp)
		k, err := io.ReadFull(src, *bp)
		total += int64(k)
		if err == nil {
			if total == r.ContentLength {
				break // all it declared, at a chunk's end: no further read or chunk
			}
			continue
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			if n := r.ContentLength; n > 0 && total != n {
				giveBack()
				return nil, shortBody(io.ErrUnexpectedEOF, n)
			}
			break // the body's end, inside this chunk (or at its start)
		}
		giveBack()
		return nil, err
	}
	if total <= bodyChunkBytes {
		// One chunk holds it all: it is the body's buffer.
		bp := chunks[0]
		for _, extra := range chunks[1:] {
			requests.PutBody(chunkClass, extra)
		}
		budget.Give(int64(len(chunks)-1) * bodyChunkBytes)
		rb := &reqBody{b: (*bp)[:total], buf: bp, class: chunkClass, charged: bodyChunkBytes, budget: budget}
		rb.refs.Store(1)
		return rb, nil
	}
	rb := &reqBody{class: -1, budget: budget}
	size := total
	if c := requests.BodyClass(int(total)); c >= 0 {
		rb.class, size = c, int64(requests.BodyClassBytes(c))
	}
	if !budget.Take(size) {
		giveBack()
		return nil, errBodyBudget
	}
	rb.charged = size
	if rb.class >= 0 {
		rb.buf = requests.GetBody(rb.class)
		rb.b = (*rb.buf)[:total]
	} else {
		rb.b = make([]byte, total)
	}
	off := 0
	for _, bp := range chunks {
		off += copy(rb.b[off:], *bp)
	}
	giveBack()
	rb.refs.Store(1)
	return rb, nil
}
