package local

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// The model-based test: random operation sequences (correct caller usage with a ledger of held
// sequences, plus optional over-release and invalid calls) run against the tree and the naive
// model side by side, checking results, state and invariants 1–12 of CONTRACT.md after every step, and
// that the summary journal replays to exactly the set walk can reach.

// source yields the random choices; rngSource for tests, byteSource for fuzzing.
type source interface{ intn(n int) int }

type rngSource struct{ r *rand.Rand }

func (s rngSource) intn(n int) int { return s.r.IntN(n) }

type byteSource struct {
	b    []byte
	done bool
}

func (s *byteSource) intn(n int) int {
	if len(s.b) == 0 {
		s.done = true
		return 0
	}
	v := int(s.b[0])
	if len(s.b) > 1 && n > 256 {
		v = v<<8 | int(s.b[1])
		s.b = s.b[1:]
	}
	s.b = s.b[1:]
	return v % n
}

const (
	holdLookup = iota
	holdPin
	holdInserted
)

type hold struct {
	tokens  []uint32
	bs      int
	adapter uint64
	matched int
	blocks  []uint32 // the lookup's matched blocks
	kind    int
}

type driverConfig struct {
	bs          int
	mixed       bool // some calls use another block size
	hss         bool
	overRelease bool
	subBlock    bool
	journalCap  int
	maxBlocks   int // eviction pressure above this many cached blocks
}

type driver struct {
	cfg                         driverConfig
	tr                          *RadixTree
	m                           *model
	r                           source
	docs                        [][]uint32
	adapters                    []uint64
	nextBlock                   uint32
	nextDisk                    uint32
	held                        []hold
	blockAdapter                map[uint32]uint64
	ledger                      map[uint32]int
	diskLedger                  map[uint32]int
	replica                     *summaryReplica
	scratchBlocks, scratchDisks map[uint32]int
	scratchVisible              map[uint64]bool
	overReleased                bool
	ops                         [16]int
}

func newDriver(cfg driverConfig, r source, docSeed uint64) *driver {
	d := &driver{
		cfg: cfg, r: r,
		tr:             NewRadixTree(Options{SubBlockMatching: cfg.subBlock, JournalCapacity: cfg.journalCap}),
		m:              newModel(cfg.subBlock),
		adapters:       []uint64{0, 0, 7, 0xABCD},
		nextBlock:      1,
		nextDisk:       1 << 20,
		blockAdapter:   map[uint32]uint64{},
		ledger:         map[uint32]int{},
		diskLedger:     map[uint32]int{},
		replica:        newSummaryReplica(),
		scratchBlocks:  map[uint32]int{},
		scratchDisks:   map[uint32]int{},
		scratchVisible: map[uint64]bool{},
	}
	// A few short documents over a tiny alphabet: prompts are their prefixes, so they share.
	dr := rand.New(rand.NewPCG(docSeed, 1))
	for i := 0; i < 4; i++ {
		doc := make([]uint32, 48)
		for j := range doc {
			doc[j] = uint32(dr.IntN(3))
		}
		d.docs = append(d.docs, doc)
	}
	return d
}

func (d *driver) blockSize() int {
	if d.cfg.mixed && d.r.intn(8) == 0 {
		return []int{2, 3, 4, 8}[d.r.intn(4)]
	}
	return d.cfg.bs
}

func (d *driver) prompt() []uint32 {
	doc := d.docs[d.r.intn(len(d.docs))]
	p := slices.Clone(doc[:d.r.intn(len(doc)+1)])
	for k := d.r.intn(4); k > 0 && d.r.intn(2) == 0; k-- {
		p = append(p, uint32(3+d.r.intn(3)))
	}
	return p
}

func (d *driver) freshBlock(adapter uint64) uint32 {
	b := d.nextBlock
	d.nextBlock++
	d.blockAdapter[b] = adapter
	return b
}

// table builds a block table for tokens: the held prefix's blocks where given, fresh ones after,
// one per full chunk plus one for a partial tail.
func (d *driver) table(tokens []uint32, bs int, adapter uint64, reuse []uint32) (bt, disks []uint32) {
	n := (len(tokens) + bs - 1) / bs
	for i := 0; i < n; i++ {
		if i < len(reuse) {
			bt = append(bt, reuse[i])
		} else {
			bt = append(bt, d.freshBlock(adapter))
		}
	}
	if d.cfg.hss && d.r.intn(4) != 0 {
		for range bt {
			if d.r.intn(5) == 0 {
				disks = append(disks, NoBlock)
			} else {
				disks = append(disks, d.nextDisk)
				d.nextDisk++
			}
		}
	}
	return bt, disks
}

func (d *driver) fail(format string, args ...any) error {
	return fmt.Errorf("op counts %v: "+format, append([]any{d.ops}, args...)...)
}

// step runs one random operation and checks everything.
func (d *driver) step() error {
	op := d.r.intn(100)
	switch {
	case op < 22: // lookup: a new sequence holds its match
		d.ops[0]++
		p, bs, a := d.prompt(), d.blockSize(), d.adapters[d.r.intn(len(d.adapters))]
		peek := d.tr.PeekMatchedTokens(p, bs, a)
		got := d.tr.Lookup(p, bs, 0, a)
		want := d.m.lookup(p, bs, a)
		if err := d.checkMatch(got, want, p, bs, a); err != nil {
			return err
		}
		if peek != got.MatchedTokens {
			return d.fail("peek %d != lookup %d", peek, got.MatchedTokens)
		}
		if got.MatchedTokens > 0 || d.r.intn(2) == 0 {
			d.held = append(d.held, hold{tokens: p, bs: bs, adapter: a, matched: got.MatchedTokens, blocks: got.MatchedBlocks, kind: holdLookup})
		}
	case op < 30: // pin
		d.ops[1]++
		p, bs, a := d.prompt(), d.blockSize(), d.adapters[d.r.intn(len(d.adapters))]
		got, want := d.tr.PinPrefix(p, bs, a), d.m.pin(p, bs, a)
		if got != want {
			return d.fail("pin %d, model %d", got, want)
		}
		d.held = append(d.held, hold{tokens: p, bs: bs, adapter: a, matched: got, kind: holdPin})
	case op < 50: // insert: continue a looked-up sequence, or a cold one (matched 0)
		d.ops[2]++
		var h hold
		if i := d.pick(holdLookup); i >= 0 && d.r.intn(4) != 0 {
			h = d.held[i]
			d.held = slices.Delete(d.held, i, i+1)
			for k := d.r.intn(6); k > 0; k-- {
				h.tokens = append(h.tokens, uint32(d.r.intn(6)))
			}
		} else {
			h = hold{tokens: d.prompt(), bs: d.blockSize(), adapter: d.adapters[d.r.intn(len(d.adapters))]}
		}
		reuse := h.blocks
		if d.r.intn(5) == 0 {
			reuse = nil // recompute: fresh blocks over the matched prefix too
		}
		bt, disks := d.table(h.tokens, h.bs, h.adapter, reuse)
		got := d.tr.Insert(h.tokens, bt, disks, h.bs, h.matched, h.adapter)
		want := d.m.insert(h.tokens, bt, disks, h.bs, h.matched, h.adapter)
		if err := d.checkAcq(got, want); err != nil {
			return err
		}
		h.kind = holdInserted
		d.held = append(d.held, h)
	case op < 72: // release one held sequence
		d.ops[3]++
		if len(d.held) == 0 {
			break
		}
		i := d.r.intn(len(d.held))
		d.release(d.held[i])
		if d.cfg.overRelease && d.r.intn(10) == 0 {
			d.overReleased = true
			d.release(d.held[i]) // over-release
		} else {
			d.held = slices.Delete(d.held, i, i+1)
		}
	case op < 84: // evict
		d.ops[4]++
		k := d.r.intn(5)
		if entries, _ := d.tr.Stats(); entries > d.cfg.maxBlocks {
			k += entries - d.cfg.maxBlocks
		}
		if err := d.evict(k); err != nil {
			return err
		}
	case op < 90: // stats, hit stats, peeks under other adapters
		d.ops[5]++
		if e, c := d.tr.Stats(); e != c || e != d.m.stats() {
			return d.fail("stats (%d,%d), model %d", e, c, d.m.stats())
		}
		p := d.prompt()
		for _, a := range []uint64{0, 7, 99} {
			if got, want := d.tr.PeekMatchedTokens(p, d.cfg.bs, a), d.m.walk(p, d.cfg.bs, a).matched; got != want {
				return d.fail("peek %d, model %d", got, want)
			}
		}
	case op < 94: // over-release of something nobody holds
		d.ops[6]++
		if !d.cfg.overRelease {
			break
		}
		d.overReleased = true
		p, bs, a := d.prompt(), d.blockSize(), d.adapters[d.r.intn(len(d.adapters))]
		d.tr.Release(p, bs, a)
		d.m.decRefs(p, bs, len(p), a)
	case op < 97: // invalid arguments: nothing changes
		d.ops[7]++
		p := d.prompt()
		bt, _ := d.table(p, 4, 0, nil)
		var disks []uint32
		bsz := 4
		switch d.r.intn(3) {
		case 0:
			bsz = -d.r.intn(3)
		case 1:
			disks = make([]uint32, len(bt)+1)
		default:
			if len(bt) == 0 {
				bsz = 0
			} else {
				bt[d.r.intn(len(bt))] = NoBlock
			}
		}
		if !d.m.valid(p, bt, disks, bsz) {
			if acq := d.tr.Insert(p, bt, disks, bsz, 0, 5); acq.Blocks != nil || acq.DiskBlockIDs != nil {
				return d.fail("invalid insert acquired %+v", acq)
			}
		}
	default: // drain: every sequence releases; then balance (invariant 2)
		d.ops[8]++
		for _, h := range d.held {
			d.release(h)
		}
		d.held = d.held[:0]
		if err := d.checkBalance(); err != nil {
			return err
		}
	}
	return d.check()
}

// adjust adds delta to x's count in a multiset, deleting zero counts.
func adjust(ms map[uint32]int, x uint32, delta int) {
	if ms[x] += delta; ms[x] == 0 {
		delete(ms, x)
	}
}

func (d *driver) pick(kind int) int {
	var idx []int
	for i, h := range d.held {
		if h.kind == kind {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return -1
	}
	return idx[d.r.intn(len(idx))]
}

func (d *driver) release(h hold) {
	if h.kind == holdInserted {
		d.tr.Release(h.tokens, h.bs, h.adapter)
		d.m.decRefs(h.tokens, h.bs, len(h.tokens), h.adapter)
		return
	}
	d.tr.ReleaseMatched(h.tokens, h.bs, h.matched, h.adapter)
	d.m.decRefs(h.tokens, h.bs, h.matched, h.adapter)
}

func (d *driver) evict(k int) error {
	got := d.tr.Evict(k)
	want := d.m.evict(k)
	if !slices.Equal(got.Physical, want.Physical) || !slices.Equal(got.DiskBlockIDs, want.DiskBlockIDs) {
		return d.fail("evict(%d) = %+v, model %+v", k, got, want)
	}
	if k > 0 && (got.Len() > k+1 || (got.Len() < k && d.m.victim() != nil)) { // invariant 11
		return d.fail("evict(%d) returned %d with candidates left", k, got.Len())
	}
	if slices.Contains(got.DiskBlockIDs, NoBlock) { // invariant 10
		return d.fail("evicted disk NoBlock")
	}
	for _, b := range got.Physical {
		adjust(d.ledger, b, -1)
	}
	for _, x := range got.DiskBlockIDs {
		adjust(d.diskLedger, x, -1)
	}
	return nil
}

func (d *driver) checkMatch(got, want PrefixMatch, p []uint32, bs int, a uint64) error {
	if got.MatchedTokens != want.MatchedTokens || !slices.Equal(got.MatchedBlocks, want.MatchedBlocks) ||
		!slices.Equal(got.MatchedDiskBlockIDs, want.MatchedDiskBlockIDs) {
		return d.fail("lookup(%v, bs %d, adapter %d) = %d %v %v, model %d %v %v", p, bs, a,
			got.MatchedTokens, got.MatchedBlocks, got.MatchedDiskBlockIDs,
			want.MatchedTokens, want.MatchedBlocks, want.MatchedDiskBlockIDs)
	}
	if !d.cfg.subBlock && (got.MatchedTokens%bs != 0 || len(got.MatchedBlocks) != got.MatchedTokens/bs) { // invariant 6
		return d.fail("unaligned match %d with S off", got.MatchedTokens)
	}
	if n := len(got.MatchedDiskBlockIDs); n != 0 && n != len(got.MatchedBlocks) { // invariant 9
		return d.fail("disk list not parallel")
	}
	for _, b := range got.MatchedBlocks {
		if d.blockAdapter[b] != a { // invariant 7
			return d.fail("block %d of adapter %d returned to adapter %d", b, d.blockAdapter[b], a)
		}
		if d.ledger[b] <= 0 { // invariant 3: only blocks the cache stores (evicted ones only if reinserted)
			return d.fail("block %d returned by lookup is not stored (evicted?)", b)
		}
	}
	return nil
}

func (d *driver) checkAcq(got, want InsertAcquired) error {
	if !slices.Equal(got.Blocks, want.Blocks) || !slices.Equal(got.ReleasedBlocks, want.ReleasedBlocks) ||
		!slices.Equal(got.DiskBlockIDs, want.DiskBlockIDs) || !slices.Equal(got.ReleasedDiskBlockIDs, want.ReleasedDiskBlockIDs) {
		return d.fail("insert = %+v, model %+v", got, want)
	}
	for _, b := range got.Blocks {
		adjust(d.ledger, b, 1)
	}
	for _, b := range got.ReleasedBlocks {
		adjust(d.ledger, b, -1)
	}
	for _, x := range got.DiskBlockIDs {
		adjust(d.diskLedger, x, 1)
	}
	for _, x := range got.ReleasedDiskBlockIDs {
		adjust(d.diskLedger, x, -1)
	}
	return nil
}

// checkBalance is invariant 2: with every sequence released, every node is back to the cache's
// own ref. Over-release and unaligned sub-block matches (CONTRACT.md, "Sub-block matching") legitimately break it.
func (d *driver) checkBalance() error {
	for _, n := range d.m.arena {
		if n == nil || n.root {
			continue
		}
		if n.ref > 1 || (n.ref != 1 && !d.overReleased && !d.cfg.subBlock && !d.cfg.mixed) {
			return d.fail("after drain node %v has ref %d", n.toks, n.ref)
		}
	}
	return nil
}

// check runs the per-step invariants.
func (d *driver) check() error {
	if err := d.m.compare(d.tr); err != nil {
		return d.fail("state: %v", err)
	}
	if err := checkStructure(d.tr); err != nil {
		return d.fail("structure: %v", err)
	}
	// Invariant 4 (and its disk twin): the owned-block ledger equals the blocks the cache stores.
	blocks, disks := d.scratchBlocks, d.scratchDisks
	clear(blocks)
	clear(disks)
	partials := 0
	for _, n := range d.m.arena {
		if n == nil || n.root {
			continue
		}
		blocks[n.block]++
		if n.disk != NoBlock {
			disks[n.disk]++
		}
		if p := n.partial; p != nil {
			partials++
			blocks[p.block]++
			if p.disk != NoBlock {
				disks[p.disk]++
			}
		}
	}
	size := 0
	for b, c := range d.ledger {
		if c < 0 || c != blocks[b] {
			return d.fail("ledger has block %d ×%d, cache ×%d", b, c, blocks[b])
		}
		size += c
	}
	if len(blocks) != len(d.ledger) {
		return d.fail("cache stores %d distinct blocks, ledger %d", len(blocks), len(d.ledger))
	}
	for x, c := range d.diskLedger {
		if c < 0 || c != disks[x] {
			return d.fail("disk ledger has %d ×%d, cache ×%d", x, c, disks[x])
		}
	}
	if len(disks) != len(d.diskLedger) {
		return d.fail("cache holds %d distinct disk ids, ledger %d", len(disks), len(d.diskLedger))
	}
	if e, _ := d.tr.Stats(); e != size-partials { // invariant 5
		return d.fail("stats %d, ledger %d − partials %d", e, size, partials)
	}
	// The summary: replaying the journal gives the snapshot, and the snapshot is what walk reaches.
	if err := d.replica.sync(d.tr); err != nil {
		return d.fail("summary: %v", err)
	}
	vis := d.m.visible(d.scratchVisible)
	if len(vis) != len(d.replica.set) {
		return d.fail("summary has %d hashes, walk reaches %d", len(d.replica.set), len(vis))
	}
	for h := range vis {
		if !d.replica.set[h] {
			return d.fail("walk reaches %x, summary lacks it", h)
		}
	}
	return nil
}

// modelOps is the total operation budget of TestModel: ≥ 100k in every full run, CI's race run
// included (about 20 s there); fewer only under -short.
func modelOps() int {
	if testing.Short() {
		return 20_000
	}
	if raceEnabled {
		return 100_000
	}
	return 120_000
}

func TestModel(t *testing.T) {
	configs := []driverConfig{
		{bs: 4, maxBlocks: 40},
		{bs: 2, hss: true, maxBlocks: 40},
		{bs: 3, overRelease: true, maxBlocks: 40},
		{bs: 4, hss: true, overRelease: true, journalCap: 16, maxBlocks: 40},
		{bs: 4, subBlock: true, hss: true, maxBlocks: 40},
		{bs: 8, mixed: true, overRelease: true, maxBlocks: 40},
		{bs: 4, mixed: true, subBlock: true, journalCap: 64, maxBlocks: 60},
	}
	const runsPerConfig = 8
	per := modelOps() / (len(configs) * runsPerConfig)
	total := 0
	for ci, cfg := range configs {
		for run := 0; run < runsPerConfig; run++ {
			seed := uint64(ci*1000 + run)
			d := newDriver(cfg, rngSource{rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))}, seed)
			for i := 0; i < per; i++ {
				if err := d.step(); err != nil {
					t.Fatalf("config %+v seed %d step %d: %v", cfg, seed, i, err)
				}
			}
			total += per
			if cfg.journalCap == 0 && d.replica.seq != d.tr.SummaryHead() {
				t.Fatalf("replica behind")
			}
		}
	}
	t.Logf("%d operations", total)
}
