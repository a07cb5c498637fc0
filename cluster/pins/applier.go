package pins

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// PrefixCache is what the Applier needs of a node's cache; *local.RadixTree satisfies it.
type PrefixCache interface {
	PinPrefix(tokens []uint32, blockSize int, adapterID uint64) int
	ReleaseMatched(tokens []uint32, blockSize, matchedTokens int, adapterID uint64)
	PeekMatchedTokens(tokens []uint32, blockSize int, adapterID uint64) int
}

// held is one prefix pin the Applier holds in the cache.
type held struct {
	pin     PrefixPin
	matched int // tokens PinPrefix took holds on; ReleaseMatched gets the same number
}

// Applier makes a node's cache hold the prefix pins that name the node. It is pure logic over the
// cache: the node agent calls Apply with store.PrefixPinsFor(node) on every table change (see
// Store.Subscribe) and periodically (a pinned prefix becomes cached when a request brings it),
// and ReleaseAll when it stops. For each pin it takes one hold with PinPrefix as soon as any of
// the prefix is cached, re-pins (new hold first, then release of the old, so the blocks never go
// unheld) when more of it got cached, and releases with exactly the matched tokens it pinned when
// the pin goes away. Safe for concurrent use.
type Applier struct {
	cache     PrefixCache
	blockSize int

	mu   sync.Mutex // guards held
	held map[PrefixKey]held
}

// NewApplier returns an Applier for a cache with the given block size.
func NewApplier(cache PrefixCache, blockSize int) *Applier {
	return &Applier{cache: cache, blockSize: blockSize, held: map[PrefixKey]held{}}
}

// ApplyStats summarises one Apply.
type ApplyStats struct {
	Held     int // pins holding cache blocks after Apply
	Pinned   int // PinPrefix calls that took holds (new pins and upgrades)
	Released int // ReleaseMatched calls
	Pending  int // desired pins none of whose blocks are cached yet
}

// Apply reconciles the cache's holds with pins (the node's desired prefix pins).
func (a *Applier) Apply(pins []PrefixPin) ApplyStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	var st ApplyStats
	if a.blockSize <= 0 {
		return st
	}
	want := make(map[PrefixKey]PrefixPin, len(pins))
	for _, p := range pins {
		want[p.Key()] = p
	}
	// Release what is no longer wanted, in key order so runs are reproducible.
	for _, k := range sortedKeys(a.held) {
		if p, ok := want[k]; ok && slices.Equal(p.Tokens, a.held[k].pin.Tokens) {
			continue
		}
		h := a.held[k]
		a.cache.ReleaseMatched(h.pin.Tokens, a.blockSize, h.matched, h.pin.AdapterID)
		delete(a.held, k)
		st.Released++
	}
	for _, k := range sortedKeys(want) {
		p := want[k]
		full := len(p.Tokens) / a.blockSize * a.blockSize
		h, ok := a.held[k]
		if ok && h.matched >= full {
			h.pin = p
			a.held[k] = h
			continue
		}
		peek := a.cache.PeekMatchedTokens(p.Tokens, a.blockSize, p.AdapterID)
		if peek <= h.matched { // nothing (more) cached yet
			if !ok {
				st.Pending++
			}
			continue
		}
		m := a.cache.PinPrefix(p.Tokens, a.blockSize, p.AdapterID)
		if m <= 0 {
			if !ok {
				st.Pending++
			}
			continue
		}
		st.Pinned++
		if ok {
			a.cache.ReleaseMatched(h.pin.Tokens, a.blockSize, h.matched, h.pin.AdapterID)
			st.Released++
		}
		a.held[k] = held{pin: p, matched: m}
	}
	st.Held = len(a.held)
	return st
}

// Run applies src's prefix pins for node after every table change and every interval (a pinned
// prefix becomes cached without any table change), until ctx ends; then it releases every hold.
// It blocks; the node agent owns the goroutine.
func (a *Applier) Run(ctx context.Context, src PinSource, node string, every time.Duration) {
	ch, stop := src.Subscribe()
	defer stop()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		a.Apply(src.PrefixPinsFor(node))
		select {
		case <-ctx.Done():
			a.ReleaseAll()
			return
		case <-ch:
		case <-t.C:
		}
	}
}

// ReleaseAll drops every hold (the node agent is stopping or the pins are gone).
func (a *Applier) ReleaseAll() int {
	return a.Apply(nil).Released
}

// Held returns the matched tokens held per pin, for tests and status pages.
func (a *Applier) Held() map[PrefixKey]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[PrefixKey]int, len(a.held))
	for k, h := range a.held {
		out[k] = h.matched
	}
	return out
}

func sortedKeys[V any](m map[PrefixKey]V) []PrefixKey {
	keys := make([]PrefixKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b PrefixKey) int {
		return cmp.Or(cmp.Compare(a.AdapterID, b.AdapterID), cmp.Compare(a.Hash, b.Hash))
	})
	return keys
}
