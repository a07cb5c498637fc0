// Package bytebudget bounds the request body bytes a router holds across all requests at once:
// a client decides how long its body is and how slowly it sends it, so without a bound shared by
// every request, many slow clients add up to whatever memory they like. The HTTP front door and
// the ext_proc endpoint picker each take from a Budget before they buffer a chunk of a body and
// give it back when they let the bytes go; a Take that would go over the limit fails, and the
// door refuses the request (429) rather than grow.
package bytebudget

import "sync/atomic"

// Budget is a limit on bytes held and the count held now. Its methods are safe for concurrent
// use; a nil *Budget has no limit (and counts nothing).
type Budget struct {
	limit int64
	held  atomic.Int64
}

// New returns a budget of limit bytes.
func New(limit int64) *Budget { return &Budget{limit: limit} }

// Take reserves n bytes and reports whether it could: false, with nothing reserved, when the
// bytes held would go over the limit.
func (b *Budget) Take(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	// Compare-and-swap rather than add-then-undo: Held never reads above the limit, not even
	// for the instant a refused Take would hold it there.
	for {
		h := b.held.Load()
		if h+n > b.limit {
			return false
		}
		if b.held.CompareAndSwap(h, h+n) {
			return true
		}
	}
}

// Give returns n bytes reserved by Take.
func (b *Budget) Give(n int64) {
	if b != nil && n > 0 {
		b.held.Add(-n)
	}
}

// Held is the bytes reserved now.
func (b *Budget) Held() int64 {
	if b == nil {
		return 0
	}
	return b.held.Load()
}

// Limit is the budget's limit (0 for a nil budget, which has none).
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}
