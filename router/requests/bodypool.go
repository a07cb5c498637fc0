package requests

import (
	"math/bits"
	"sync"
)

// Request bodies are held in pooled buffers, one pool per power-of-two size class, shared by the
// doors that hold bodies: the front door reads each body into one (router/frontdoor body.go) and
// the endpoint picker joins a streamed body's chunks into one (router/extproc stream.go), so a
// request allocates nothing that grows with its prompt to hold its body.
const (
	// minBodyClassBits is the smallest class, 4 KiB: a short chat body.
	minBodyClassBits = 12
	// maxBodyClassBits is the largest class, 1 MiB (a 128k-token id prompt is ~800 KB): larger
	// bodies, up to a door's body cap, are allocated per request rather than kept in a pool that
	// would hold several MiB per idle class.
	maxBodyClassBits = 20
)

// BodyClasses is the number of pooled size classes: BodyClass returns 0 to BodyClasses-1.
const BodyClasses = maxBodyClassBits - minBodyClassBits + 1

var bodyPools [BodyClasses]sync.Pool // *[]byte

// BodyClass is the pool class of an n-byte body, or -1 when n is above the largest class.
func BodyClass(n int) int {
	c := max(bits.Len(uint(n-1)), minBodyClassBits) - minBodyClassBits
	if c >= BodyClasses {
		return -1
	}
	return c
}

// BodyClassBytes is the length of class c's buffers.
func BodyClassBytes(c int) int { return 1 << (c + minBodyClassBits) }

// GetBody returns a buffer of class c, BodyClassBytes(c) long: an idle one as its last holder
// left it (its holder writes before it reads), or a new one.
func GetBody(c int) *[]byte {
	if bp, _ := bodyPools[c].Get().(*[]byte); bp != nil {
		return bp
	}
	b := make([]byte, BodyClassBytes(c))
	return &b
}

// PutBody gives back bp, a buffer of class c (at its full length) that its holder no longer
// reads.
func PutBody(c int, bp *[]byte) { bodyPools[c].Put(bp) }
