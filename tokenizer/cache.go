package tokenizer

import (
	"container/list"
	"hash/maphash"
	"strings"
	"sync"
)

// SegmentCacheBytes bounds the segment cache per tokenizer: 64 MiB holds the text and ids of a
// few hundred long conversations (a 32k-token chat is ~130 KB of text plus ~130 KB of ids), so
// the turns of the chats in flight stay cached, without letting traffic grow the router. A
// segment over a quarter of a shard's share (1 MiB) is not cached.
const SegmentCacheBytes = 64 << 20

// minCachedSegmentBytes: shorter segments (role names, "\n") tokenize faster than a cache
// lookup and clone would cost.
const minCachedSegmentBytes = 64

// segEntryOverhead approximates an entry's bookkeeping (map slot, list element, headers).
const segEntryOverhead = 128

// segShards splits the segment cache so concurrent requests rarely share a lock.
const segShards = 16

// segmentCache memoizes the ids of text between added tokens, LRU within a byte budget per
// shard. Exact: a segment's ids are a function of its text and whether it starts the input.
type segmentCache struct {
	seed   maphash.Seed
	shards [segShards]segShard
}

type segShard struct {
	mu     sync.Mutex
	budget int
	used   int
	m      map[segKey]*list.Element
	lru    list.List
}

type segKey struct {
	s       string
	atStart bool
}

type segEntry struct {
	key segKey
	ids []uint32
}

func newSegmentCache(budget int) *segmentCache {
	c := &segmentCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].budget = budget / segShards
		c.shards[i].m = map[segKey]*list.Element{}
	}
	return c
}

func (c *segmentCache) shard(s string) *segShard {
	return &c.shards[maphash.String(c.seed, s)%segShards]
}

func (c *segmentCache) get(s string, atStart bool) ([]uint32, bool) {
	sh := c.shard(s)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[segKey{s, atStart}]
	if !ok {
		return nil, false
	}
	sh.lru.MoveToFront(e)
	return e.Value.(*segEntry).ids, true
}

func (c *segmentCache) put(s string, atStart bool, ids []uint32) {
	sh := c.shard(s)
	cost := len(s) + 4*len(ids) + segEntryOverhead
	if cost > sh.budget/4 { // one huge segment must not flush everything else
		return
	}
	k := segKey{strings.Clone(s), atStart}
	ent := &segEntry{key: k, ids: append([]uint32(nil), ids...)}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[k]; ok {
		return
	}
	sh.m[k] = sh.lru.PushFront(ent)
	sh.used += cost
	for sh.used > sh.budget {
		old := sh.lru.Back()
		oe := old.Value.(*segEntry)
		sh.lru.Remove(old)
		delete(sh.m, oe.key)
		sh.used -= len(oe.key.s) + 4*len(oe.ids) + segEntryOverhead
	}
}

// maxCachedWordBytes: words (pre-tokenizer output) up to this length are memoized, as HF's BPE
// cache does for words under 256 characters; longer ones are merged each time.
const maxCachedWordBytes = 256

// wordShards and wordShardEntries bound the word cache at 64×2048 entries (~10 MB): well over
// the distinct words of a working set, and a shard that fills is simply cleared.
const (
	wordShards       = 64
	wordShardEntries = 2048
)

// wordCache memoizes the model's ids per word, like HF's BPE cache.
type wordCache struct {
	seed   maphash.Seed
	shards [wordShards]wordShard
}

type wordShard struct {
	mu sync.RWMutex
	m  map[string][]uint32
}

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
	return c
}

func (c *wordCache) shard(w string) *wordShard {
	return &c.shards[maphash.String(c.seed, w)%wordShards]
}

func (c *wordCache) get(w string) ([]uint32, bool) {
	sh := c.shard(w)
	sh.mu.RLock()
	ids, ok := sh.m[w]
	sh.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []uint32) {
	sh := c.shard(w)
	v := append([]uint32(nil), ids...)
	k := strings.Clone(w)
	sh.mu.Lock()
	if len(sh.m) >= wordShardEntries {
		clear(sh.m)
	}
	sh.m[k] = v
	sh.mu.Unlock()
}
