package extproc

import "github.com/prefixmesh/prefixmesh/router/requests"

// A request body of several chunks is joined, once its end came, in a pooled buffer of the body's
// size (the request service's body pools, requests.GetBody, which the front door's bodies come
// from too): one copy of its chunks, with no regrowth and no zeroing of fresh memory per request.
// A body of one chunk is read where its message put it.

// getBody returns an empty buffer with room for n bytes (capped at limit, the body cap: a
// Content-Length is only a hint).
func getBody(n, limit int) []byte {
	n = min(max(n, 1), limit)
	c := requests.BodyClass(n)
	if c < 0 {
		return make([]byte, 0, n)
	}
	return (*requests.GetBody(c))[:0]
}

// putBody returns b to its pool when its capacity is exactly a class (a buffer that grew past
// its class by append is left to the collector).
func putBody(b []byte) {
	c := cap(b)
	if c == 0 || c&(c-1) != 0 {
		return
	}
	if k := requests.BodyClass(c); k >= 0 && requests.BodyClassBytes(k) == c {
		b = b[:c]
		requests.PutBody(k, &b)
	}
}
