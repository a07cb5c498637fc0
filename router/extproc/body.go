package extproc

import (
	"math/bits"
	"sync"
)

// A request body of several chunks is joined, once its end came, in a pooled buffer of the body's
// size, one pool per power-of-two size class: one copy of its chunks, with no regrowth and no
// zeroing of fresh memory per request (the front door pools its bodies the same way,
// router/frontdoor body.go). A body of one chunk is read where its message put it.
const (
	// minBodyBits is the smallest class, 4 KiB: a short chat body.
	minBodyBits = 12
	// maxBodyBits is the largest pooled class, 1 MiB (a 128k-token id prompt is ~800 KB);
	// larger bodies, up to Config.MaxBodyBytes, are allocated per request rather than kept idle.
	maxBodyBits = 20
)

var bodyPools [maxBodyBits - minBodyBits + 1]sync.Pool // *[]byte

// bodyClass is the pool index for an n-byte body, or -1 above the largest class.
func bodyClass(n int) int {
	c := max(bits.Len(uint(n-1)), minBodyBits) - minBodyBits
	if c >= len(bodyPools) {
		return -1
	}
	return c
}

// getBody returns an empty buffer with room for n bytes (capped at limit, the body cap: a
// Content-Length is only a hint).
func getBody(n, limit int) []byte {
	n = min(max(n, 1), limit)
	c := bodyClass(n)
	if c < 0 {
		return make([]byte, 0, n)
	}
	if bp, _ := bodyPools[c].Get().(*[]byte); bp != nil {
		return (*bp)[:0]
	}
	return make([]byte, 0, 1<<(c+minBodyBits))
}

// putBody returns b to its pool when its capacity is exactly a class (a buffer that grew past
// its class by append is left to the collector).
func putBody(b []byte) {
	c := cap(b)
	if c == 0 || c&(c-1) != 0 {
		return
	}
	if k := bits.Len(uint(c)) - 1 - minBodyBits; k >= 0 && k < len(bodyPools) {
		b = b[:0]
		bodyPools[k].Put(&b)
	}
}
