package kvpool

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// recorder is a PrefixCache that keeps, beside the real tree, the multiset of blocks the cache
// stores as reported to its caller (InsertAcquired and EvictedBlocks): the cache's refs.
type recorder struct {
	local.PrefixCache
	cacheRefs map[uint32]int
}

func newRecorder() *recorder {
	return &recorder{PrefixCache: local.NewRadixTree(local.Options{}), cacheRefs: map[uint32]int{}}
}

func (r *recorder) Insert(tokens, bt, disk []uint32, bs, matched int, adapter uint64) local.InsertAcquired {
	acq := r.PrefixCache.Insert(tokens, bt, disk, bs, matched, adapter)
	for _, b := range acq.Blocks {
		r.cacheRefs[b]++
	}
	for _, b := range acq.ReleasedBlocks {
		r.cacheRefs[b]--
	}
	return acq
}

func (r *recorder) Evict(n int) local.EvictedBlocks {
	ev := r.PrefixCache.Evict(n)
	for _, b := range ev.Physical {
		r.cacheRefs[b]--
	}
	return ev
}

// checkHolds verifies refs == sequences' holds + cache's refs for every block, plus the pool's
// structural invariants and the absence of contract violations.
func checkHolds(t *testing.T, p *Pool, rec *recorder, live []*Seq) {
	t.Helper()
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	if v := p.Stats().Violations; v != 0 {
		t.Fatalf("%d contract violations", v)
	}
	want := make([]int32, len(p.refs))
	for _, s := range live {
		for _, b := range s.blocks {
			want[b]++
		}
	}
	for b, n := range rec.cacheRefs {
		if n < 0 {
			t.Fatalf("cache refs on block %d = %d", b, n)
		}
		want[b] += int32(n)
	}
	for b := range want {
		if want[b] != p.refs[b] {
			t.Fatalf("block %d: pool refs %d, sequences + cache hold %d", b, p.refs[b], want[b])
		}
	}
	if s := p.Stats(); s.Running != len(live) {
		t.Fatalf("Running = %d, %d live", s.Running, len(live))
	}
}

func seqTokens(n int, base uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = base + uint32(i)
	}
	return t
}

func newPool(t testing.TB, n, bs int) (*Pool, *recorder) {
	t.Helper()
	rec := newRecorder()
	p, err := New(rec, n, bs)
	if err != nil {
		t.Fatal(err)
	}
	return p, rec
}

func mustAdmit(t *testing.T, p *Pool, tokens []uint32, adapter uint64, out int) *Seq {
	t.Helper()
	s, err := p.Admit(tokens, adapter, out)
	if err != nil {
		t.Fatalf("Admit(%d tokens, +%d): %v", len(tokens), out, err)
	}
	return s
}

// runToCache admits, inserts and finishes a sequence so that only the cache holds its prompt.
func runToCache(t *testing.T, p *Pool, tokens []uint32, adapter uint64) {
	t.Helper()
	s := mustAdmit(t, p, tokens, adapter, 0)
	if err := s.Insert(); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
}

func TestNewValidates(t *testing.T) {
	for _, c := range []struct {
		cache local.PrefixCache
		n, bs int
	}{{nil, 1, 1}, {local.NewRadixTree(local.Options{}), 0, 16}, {local.NewRadixTree(local.Options{}), 4, 0}, {local.NewRadixTree(local.Options{}), MaxBlocks + 1, 16}} {
		if _, err := New(c.cache, c.n, c.bs); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%v, %d, %d) err = %v", c.cache, c.n, c.bs, err)
		}
	}
}

// The reference's prefix_reclaim_tests.rs case 1: a warm admission reuses the cached prefix and evicts nothing.
func TestWarmAdmissionKeepsPrefix(t *testing.T) {
	p, rec := newPool(t, 10, 16)
	prefix := seqTokens(96, 1000)
	runToCache(t, p, prefix, 0)
	if got := p.Stats().Free; got != 4 {
		t.Fatalf("free = %d after caching 6 blocks, want 4", got)
	}
	s := mustAdmit(t, p, append(append([]uint32{}, prefix...), 1, 2, 3, 4), 0, 1) // 101 tokens: 7 blocks
	checkHolds(t, p, rec, []*Seq{s})
	if s.MatchedTokens() != 96 || p.Stats().Evicted != 0 || p.Stats().Free != 3 {
		t.Fatalf("matched %d, stats %+v", s.MatchedTokens(), p.Stats())
	}
	if err := s.Insert(); err != nil {
		t.Fatal(err)
	}
	checkHolds(t, p, rec, []*Seq{s})
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	checkHolds(t, p, rec, nil)
	if got := p.Reclaim(10); got != 10 {
		t.Fatalf("after evicting everything %d free, want 10", got)
	}
	checkHolds(t, p, rec, nil)
}

// prefix_reclaim_tests.rs case 2, adapted: a tail that cannot fit evicts others but never the reused prefix, and
// the refusal is ErrPoolBusy while a running sequence holds the rest.
func TestReclaimNeverEvictsReusedPrefix(t *testing.T) {
	p, rec := newPool(t, 10, 16)
	prefix := seqTokens(96, 1000)
	runToCache(t, p, prefix, 0)              // 6 cached blocks
	runToCache(t, p, seqTokens(16, 9000), 0) // 1 newer, unrelated cached block
	other := mustAdmit(t, p, seqTokens(20, 5000), 0, 12)
	checkHolds(t, p, rec, []*Seq{other}) // 2 held by a running sequence, 1 free
	prompt := append(append([]uint32{}, prefix...), seqTokens(48, 7000)...)
	tree := rec.PrefixCache.(*local.RadixTree)
	before := tree.HitStats()
	if _, err := p.Admit(prompt, 0, 0); !errors.Is(err, ErrPoolBusy) { // 9 blocks, 6 reusable
		t.Fatalf("Admit err = %v, want ErrPoolBusy", err)
	}
	if tree.HitStats() != before {
		t.Fatal("a refused admission counted a lookup")
	}
	checkHolds(t, p, rec, []*Seq{other})
	if got := rec.PeekMatchedTokens(seqTokens(16, 9000), 16, 0); got != 0 {
		t.Fatalf("unrelated entry still cached (%d tokens)", got)
	}
	if got := rec.PeekMatchedTokens(prompt, 16, 0); got != 96 {
		t.Fatalf("reused prefix lost: peek %d, want 96", got)
	}
	if err := other.Finish(); err != nil {
		t.Fatal(err)
	}
	s := mustAdmit(t, p, prompt, 0, 0)
	if s.MatchedTokens() != 96 {
		t.Fatalf("matched %d, want 96", s.MatchedTokens())
	}
	checkHolds(t, p, rec, []*Seq{s})
	if err := s.Finish(); err != nil { // never inserted: rolls the lookup back
		t.Fatal(err)
	}
	checkHolds(t, p, rec, nil)
	if got := p.Reclaim(10); got != 10 {
		t.Fatalf("free = %d after full eviction, want 10", got)
	}
}

func TestTooLargeAndInvalid(t *testing.T) {
	p, rec := newPool(t, 4, 16)
	if _, err := p.Admit(seqTokens(60, 1), 0, 5); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("65 tokens in 64: err = %v", err)
	}
	if !p.Fits(60, 4) || p.Fits(60, 5) {
		t.Fatal("Fits disagrees with Admit")
	}
	if _, err := p.Admit(seqTokens(4, 1), 0, -1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative output: err = %v", err)
	}
	s := mustAdmit(t, p, seqTokens(60, 1), 0, 4)
	if err := s.Insert(); err != nil {
		t.Fatal(err)
	}
	if err := s.Insert(); !errors.Is(err, ErrInserted) {
		t.Fatalf("second Insert: %v", err)
	}
	if err := s.Finish(); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(); !errors.Is(err, ErrFinished) {
		t.Fatalf("second Finish: %v", err)
	}
	if err := s.Insert(); !errors.Is(err, ErrFinished) {
		t.Fatalf("Insert after Finish: %v", err)
	}
	checkHolds(t, p, rec, nil)
	// An empty prompt with no output takes nothing and is harmless.
	e := mustAdmit(t, p, nil, 0, 0)
	if err := e.Insert(); err != nil {
		t.Fatal(err)
	}
	if err := e.Finish(); err != nil {
		t.Fatal(err)
	}
	checkHolds(t, p, rec, nil)
}

// Two sequences with the same new prompt both insert: the second adopts (block adoption, local/CONTRACT.md,
// "Insert") and
// the released blocks stay with the first sequence until it finishes.
func TestConcurrentSamePromptAdoption(t *testing.T) {
	p, rec := newPool(t, 16, 4)
	prompt := seqTokens(10, 1)
	a := mustAdmit(t, p, prompt, 0, 2)
	b := mustAdmit(t, p, prompt, 0, 2)
	live := []*Seq{a, b}
	for _, s := range live {
		if err := s.Insert(); err != nil {
			t.Fatal(err)
		}
		checkHolds(t, p, rec, live)
	}
	c := mustAdmit(t, p, prompt, 0, 2)
	if c.MatchedTokens() != 8 {
		t.Fatalf("third sequence matched %d, want 8", c.MatchedTokens())
	}
	live = append(live, c)
	checkHolds(t, p, rec, live)
	for len(live) > 0 {
		if err := live[0].Finish(); err != nil {
			t.Fatal(err)
		}
		live = live[1:]
		checkHolds(t, p, rec, live)
	}
	if got := p.Reclaim(16); got != 16 {
		t.Fatalf("free = %d, want 16", got)
	}
}

func TestAdapterIsolation(t *testing.T) {
	p, _ := newPool(t, 16, 4)
	prompt := seqTokens(12, 1)
	runToCache(t, p, prompt, 7)
	if s := mustAdmit(t, p, prompt, 0, 0); s.MatchedTokens() != 0 {
		t.Fatalf("base model reused adapter 7's blocks (%d tokens)", s.MatchedTokens())
	}
	if s := mustAdmit(t, p, prompt, 7, 0); s.MatchedTokens() != 12 {
		t.Fatalf("adapter 7 matched %d, want 12", s.MatchedTokens())
	}
}

func TestCosts(t *testing.T) {
	c := Costs{PrefillTokensPerSec: 10000, DecodeTokensPerSec: 50}
	cases := []struct {
		got, want time.Duration
	}{
		{c.PrefillTime(4096), 409600 * time.Microsecond},
		{c.PrefillTime(0), 0},
		{c.PrefillTime(-3), 0},
		{c.DecodeTime(10), 200 * time.Millisecond},
		{Costs{}.DecodeTime(10), 0},
	}
	for i, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("case %d: %v, want %v", i, tc.got, tc.want)
		}
	}
}

// TestModelRandom drives random admit/insert/finish/reclaim interleavings under heavy pressure
// and checks after every step: refs = holds + cache refs, the free list, no violations, that a
// reused block still holds the KV of the chunk it is reused for, and that ErrPoolBusy only comes
// while some sequence runs. At the end everything is finished and evicted: all blocks are free.
func TestModelRandom(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { modelRun(t, seed, 400) })
	}
}

func modelRun(t *testing.T, seed uint64, steps int) {
	const n, bs = 24, 4
	rng := rand.New(rand.NewPCG(seed, 99))
	p, rec := newPool(t, n, bs)
	content := make([]uint64, n) // what KV a block holds: the chained hash of its chunk, or noise
	noise := uint64(1)
	// Prompts from a few families sharing prefixes, under two adapters.
	families := make([][]uint32, 4)
	for i := range families {
		families[i] = seqTokens(64, uint32(i*1000))
	}
	var live []*Seq
	var adapters = map[*Seq]uint64{}
	for step := range steps {
		switch op := rng.IntN(10); {
		case op < 4: // admit
			fam := families[rng.IntN(len(families))]
			tokens := append([]uint32(nil), fam[:1+rng.IntN(40)]...)
			if rng.IntN(4) == 0 {
				tokens = append(tokens, uint32(100000+rng.IntN(5)))
			}
			adapter := uint64(rng.IntN(2))
			out := rng.IntN(12)
			peek := rec.PeekMatchedTokens(tokens, bs, adapter)
			s, err := p.Admit(tokens, adapter, out)
			switch {
			case p.BlocksFor(len(tokens), out) > n:
				if !errors.Is(err, ErrTooLarge) {
					t.Fatalf("step %d: oversized admit err = %v", step, err)
				}
			case errors.Is(err, ErrPoolBusy):
				if len(live) == 0 {
					t.Fatalf("step %d: ErrPoolBusy with nothing running", step)
				}
			case err != nil:
				t.Fatalf("step %d: %v", step, err)
			default:
				if s.MatchedTokens() != peek/bs*bs || len(s.blocks) != p.BlocksFor(len(tokens), out) {
					t.Fatalf("step %d: matched %d (peek %d), %d blocks", step, s.MatchedTokens(), peek, len(s.blocks))
				}
				hashes := local.BlockHashes(tokens, bs, adapter)
				for i, b := range s.blocks {
					switch {
					case i < s.MatchedTokens()/bs:
						if content[b] != hashes[i] {
							t.Fatalf("step %d: reused block %d holds %x, chunk %d is %x", step, b, content[b], i, hashes[i])
						}
					case i < len(hashes):
						content[b] = hashes[i] // "prefill" writes the chunk's KV
					default:
						noise++
						content[b] = noise // partial tail and output
					}
				}
				live = append(live, s)
				adapters[s] = adapter
			}
		case op < 7 && len(live) > 0: // insert
			s := live[rng.IntN(len(live))]
			if err := s.Insert(); err != nil && !errors.Is(err, ErrInserted) {
				t.Fatalf("step %d: %v", step, err)
			}
		case op < 9 && len(live) > 0: // finish
			i := rng.IntN(len(live))
			if err := live[i].Finish(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			live = append(live[:i], live[i+1:]...)
		default:
			p.Reclaim(rng.IntN(n + 1))
		}
		checkHolds(t, p, rec, live)
	}
	for _, s := range live {
		if err := s.Finish(); err != nil {
			t.Fatal(err)
		}
	}
	checkHolds(t, p, rec, nil)
	t.Logf("seed %d: %+v", seed, p.Stats())
	if got := p.Reclaim(n); got != n {
		t.Fatalf("leak: %d of %d blocks free after finishing and evicting everything", got, n)
	}
	if e, c := rec.Stats(); e != 0 || c != 0 {
		t.Fatalf("cache still holds %d entries, %d blocks", e, c)
	}
}

// BenchmarkAdmitInsertFinish8k measures one request's pool work for an 8k-token prompt (+128
// output tokens): warm (the whole prompt is cached: lookup, reuse, insert over existing nodes,
// release), warm in a full pool (plus the reclaim's pin and unpin) and cold (a new prompt each
// time, the previous one evicted to make room), beside the floor of hashing the prompt once.
func BenchmarkAdmitInsertFinish8k(b *testing.B) {
	const bs, promptLen, out = 16, 8192, 128
	blocks := (promptLen + out) / bs
	prompt := seqTokens(promptLen, 1)
	b.Run("hash-floor", func(b *testing.B) {
		b.ReportAllocs()
		dst := make([]uint64, 0, promptLen/bs)
		for b.Loop() {
			dst = local.AppendBlockHashes(dst[:0], prompt, bs, 0)
		}
	})
	run := func(b *testing.B, poolBlocks int, distinct bool) {
		// With poolBlocks == blocks the pool holds exactly one request, so a cold admission must
		// evict all of the other prompt, which the previous iteration left cached, and a warm
		// one takes the reclaim path (pin, evict nothing, unpin) before its lookup.
		p, err := New(local.NewRadixTree(local.Options{}), poolBlocks, bs)
		if err != nil {
			b.Fatal(err)
		}
		prompts := [2][]uint32{seqTokens(promptLen, 1), seqTokens(promptLen, 1<<20)}
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			tokens := prompts[0]
			if distinct {
				tokens = prompts[i%2]
				i++
			}
			s, err := p.Admit(tokens, 0, out)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Insert(); err != nil {
				b.Fatal(err)
			}
			if err := s.Finish(); err != nil {
				b.Fatal(err)
			}
		}
		if distinct && p.Stats().Evicted == 0 {
			b.Fatal("cold run evicted nothing")
		}
	}
	b.Run("warm", func(b *testing.B) { run(b, 2*blocks, false) })
	b.Run("warm-reclaim", func(b *testing.B) { run(b, blocks, false) })
	b.Run("cold-evicting", func(b *testing.B) { run(b, blocks, true) })
}
