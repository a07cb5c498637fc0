package kvevents

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
)

// check verifies the mirror's invariants: the index and the arena agree, links are symmetric,
// visibility follows the rule, canon counts equal the visible nodes, and the stats add up.
func (m *CacheMirror) check() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	counts := map[uint64]uint32{}
	perGroup := map[rcKey]int{} // groups of the rank a hash is visible in
	seen := map[mkey]bool{}     // (hash, rank and group) counted
	blocks, orphans, withParent, children := 0, 0, 0, 0
	var tiers [numTiers]int
	for k, i := range m.byKey {
		n := &m.nodes[i]
		if n.key != k {
			return fmt.Errorf("index %v → node %d with key %v", k, i, n.key)
		}
		if n.flags&fKnown != 0 {
			blocks++
			if _, ok := m.pending[i]; ok {
				orphans++
			}
		} else if n.first == noNode {
			return fmt.Errorf("placeholder %d without children", i)
		}
		if n.flags&fKnown == 0 && n.copies != ([numTiers]uint32{}) {
			return fmt.Errorf("placeholder %d holds copies", i)
		}
		for t := range n.copies {
			tiers[t] += int(n.copies[t])
		}
		if n.parent >= 0 {
			withParent++
		}
		for c := n.first; c != noNode; c = m.nodes[c].next { // O(N) over all nodes
			if m.nodes[c].parent != i {
				return fmt.Errorf("node %d lists child %d whose parent is %d", i, c, m.nodes[c].parent)
			}
			if children++; children > len(m.nodes) {
				return fmt.Errorf("a child list loops")
			}
		}
		if want := m.shouldShow(i); want != (n.flags&fVisible != 0) {
			return fmt.Errorf("node %d visible=%v, rule says %v", i, !want, want)
		}
		if n.flags&fVisible != 0 {
			if len(m.groups[n.key.src>>16]) <= 1 {
				counts[n.canon]++
			} else if !seen[mkey{n.canon, n.key.src}] {
				seen[mkey{n.canon, n.key.src}] = true
				perGroup[rcKey{n.canon, n.key.src >> 16}]++
			}
		}
		if n.first == noNode && n.copies == ([numTiers]uint32{}) {
			return fmt.Errorf("node %d has no copies and no children but was not freed", i)
		}
	}
	// lower counts, per canonical hash and lower tier, the nodes with that canon holding a copy.
	lower := map[uint64][numTiers]uint32{}
	for _, i := range m.byKey {
		if n := &m.nodes[i]; n.flags&fCanon != 0 {
			for t := TierGPU + 1; t < numTiers; t++ {
				if n.copies[t] > 0 {
					v := lower[n.canon]
					v[t]++
					lower[n.canon] = v
				}
			}
		}
	}
	if !maps.Equal(lower, m.lower) {
		return fmt.Errorf("lower-tier counts %v, nodes say %v", m.lower, lower)
	}
	for k, v := range perGroup { // credited once where visible in every group of the rank
		if v == len(m.groups[k.rank]) {
			counts[k.canon]++
		}
	}
	if withParent != children {
		return fmt.Errorf("%d nodes have a parent, %d are listed as children", withParent, children)
	}
	if len(counts) != len(m.canon) {
		return fmt.Errorf("canon has %d hashes, visible nodes %d", len(m.canon), len(counts))
	}
	for h, c := range counts {
		if m.canon[h] != c {
			return fmt.Errorf("canon[%x] = %d, want %d", h, m.canon[h], c)
		}
	}
	if blocks != m.stats.Blocks || orphans != m.stats.Orphans || tiers != m.stats.Tiers {
		return fmt.Errorf("stats blocks %d orphans %d tiers %v; counted %d %d %v", m.stats.Blocks, m.stats.Orphans, m.stats.Tiers, blocks, orphans, tiers)
	}
	return nil
}

// refMirror is the naive reference: every block as published, visibility recomputed from scratch.
type refMirror struct {
	bs     int
	blocks map[mkey]*refBlock
	groups map[int]map[int]bool // rank → KV-cache groups reported since its last clear
}

type refBlock struct {
	parent    uint64
	hasParent bool
	tokens    []uint32
	adapter   uint64
	match     bool
	gpu       int
	other     int
}

func (r *refMirror) apply(rank int, ev *Event) {
	src := srcOf(rank, ev.Group)
	switch ev.Kind {
	case KindCleared:
		for k := range r.blocks {
			if int(k.src>>16) == rank {
				delete(r.blocks, k)
			}
		}
		delete(r.groups, rank)
	case KindRemoved:
		for _, h := range ev.Hashes {
			b := r.blocks[mkey{h, src}]
			if b == nil {
				continue
			}
			if ev.Tier == TierGPU && b.gpu > 0 {
				b.gpu--
			} else if ev.Tier != TierGPU && b.other > 0 {
				b.other--
			}
		}
	case KindStored:
		if len(ev.Tokens) == 0 {
			for _, h := range ev.Hashes {
				if b := r.blocks[mkey{h, src}]; b != nil {
					if ev.Tier == TierGPU {
						b.gpu++
					} else {
						b.other++
					}
				}
			}
			return
		}
		if len(ev.Hashes) == 0 {
			return
		}
		if r.groups == nil {
			r.groups = map[int]map[int]bool{}
		}
		if r.groups[rank] == nil {
			r.groups[rank] = map[int]bool{}
		}
		r.groups[rank][ev.Group] = true
		aligned := ev.BlockSize == r.bs && len(ev.Tokens) == len(ev.Hashes)*r.bs
		parent, has := ev.Parent, ev.HasParent
		for i, h := range ev.Hashes {
			k := mkey{h, src}
			b := r.blocks[k]
			if b == nil || b.tokens == nil && !b.match && b.gpu == 0 && b.other == 0 {
				b = &refBlock{parent: parent, hasParent: has, adapter: local.AdapterIDOf(ev.LoRAName)}
				b.match = aligned && !ev.Salted && (len(ev.Extra) == 0 || ev.Extra[i] != extraOther)
				if aligned {
					b.tokens = ev.Tokens[i*r.bs : (i+1)*r.bs : (i+1)*r.bs]
				}
				r.blocks[k] = b
			}
			if ev.Tier == TierGPU {
				b.gpu++
			} else {
				b.other++
			}
			parent, has = h, true
		}
	}
	// Blocks with no copies are gone from the engine; the reference forgets them once no block
	// names them as parent (their tokens still give their children's canonical hashes, and a
	// later store of a tier copy finds them, as in the mirror).
	for again := true; again; {
		again = false
		parents := map[mkey]bool{}
		for k, b := range r.blocks {
			if b.hasParent {
				parents[mkey{b.parent, k.src}] = true
			}
		}
		for k, b := range r.blocks {
			if b.gpu == 0 && b.other == 0 && !parents[k] {
				delete(r.blocks, k)
				again = true
			}
		}
	}
}

// summary is the set of canonical hashes the engine would match from the root: in a rank with
// several KV-cache groups, those every group holds.
func (r *refMirror) summary() []uint64 {
	type rg struct {
		h    uint64
		rank int
	}
	in := map[rg]map[int]bool{}
	for k := range r.blocks {
		if h, ok := r.canon(k, 0); ok {
			x := rg{h, int(k.src >> 16)}
			if in[x] == nil {
				in[x] = map[int]bool{}
			}
			in[x][int(k.src&0xffff)] = true
		}
	}
	set := map[uint64]bool{}
	for x, gs := range in {
		if len(gs) >= len(r.groups[x.rank]) {
			set[x.h] = true
		}
	}
	out := make([]uint64, 0, len(set))
	for h := range set {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

func (r *refMirror) canon(k mkey, depth int) (uint64, bool) {
	b := r.blocks[k]
	if b == nil || b.gpu == 0 || !b.match || depth > 10000 {
		return 0, false
	}
	if !b.hasParent {
		return local.ChainHash(local.AdapterSeed(b.adapter), b.tokens), true
	}
	p, ok := r.canon(mkey{b.parent, k.src}, depth+1)
	if !ok {
		return 0, false
	}
	return local.ChainHash(p, b.tokens), true
}

// splitTierKeys splits a mirror's summary into GPU keys and the canonical hashes behind its CPU
// tier keys (the model's only lower tier): a key is a CPU tier key when un-salting it gives the
// canonical hash of a block the generator published (canon: engine hash → canonical hash).
func splitTierKeys(keys []uint64, canon map[uint64]uint64) (gpu, cpu []uint64) {
	known := map[uint64]bool{}
	for _, h := range canon {
		known[h] = true
	}
	for _, k := range keys {
		if h := local.TierKey(k, local.TierCPU); known[h] && !known[k] {
			cpu = append(cpu, h)
			continue
		}
		gpu = append(gpu, k)
	}
	return gpu, cpu
}

// holdsOffloaded reports whether some reference block with canonical hash h has a copy off the
// GPU.
func (r *refMirror) holdsOffloaded(h uint64, canon map[uint64]uint64) bool {
	for k, b := range r.blocks {
		if c, ok := canon[k.hash]; ok && c == h && b.other > 0 {
			return true
		}
	}
	return false
}

func sortedSnapshot(m *CacheMirror) []uint64 {
	s, _ := m.SummarySnapshot(nil)
	slices.Sort(s)
	return s
}

// TestMirrorModel drives the mirror with random event streams that look like an engine's (shared
// prefixes, duplicate stores, removal of any block including interior ones, clears, orphans,
// LoRA and salted chains, offload tiers, a second group and rank) and compares its summary with
// the naive reference after every event. The journal replayed from the start must equal the
// snapshot too.
func TestMirrorModel(t *testing.T) {
	const bs = 4
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		m := NewCacheMirror(bs)
		ref := &refMirror{bs: bs, blocks: map[mkey]*refBlock{}}
		type chain struct {
			hashes []uint64
			lora   string
		}
		var chains []chain
		nextHash := uint64(1)
		journalSet := map[uint64]bool{}
		tokensOf := map[uint64][]uint32{} // an engine hash names one token block, forever
		parentOf := map[uint64]uint64{}   // … and one parent (0: the root)
		shapeOf := map[uint64]Event{}     // … and one group, salt and extra key
		canonOf := map[uint64]uint64{}    // … and one canonical hash, when its chain has a root
		var since uint64
		var twin *CacheMirror // the mirror restored from a checkpoint
		for step := 0; step < 400; step++ {
			var ev Event
			rank := 0
			if rng.IntN(10) == 0 {
				rank = 1
			}
			switch op := rng.IntN(100); {
			case op < 45: // store a new chain, possibly extending a known one
				ev = Event{Kind: KindStored, BlockSize: bs}
				nb := 1 + rng.IntN(4)
				var base chain
				if len(chains) > 0 && rng.IntN(3) > 0 {
					base = chains[rng.IntN(len(chains))]
					cut := rng.IntN(len(base.hashes) + 1)
					base.hashes = base.hashes[:cut]
					if cut > 0 {
						ev.Parent, ev.HasParent = base.hashes[cut-1], true
					}
				} else if rng.IntN(4) == 0 {
					base.lora = []string{"7", "ad"}[rng.IntN(2)]
				}
				ev.LoRAName = base.lora
				if rng.IntN(15) == 0 { // an orphan: the parent was never published
					ev.Parent, ev.HasParent = 1<<40+nextHash, true
					nextHash++
				}
				for i := 0; i < nb; i++ {
					ev.Hashes = append(ev.Hashes, nextHash)
					nextHash++
					for j := 0; j < bs; j++ {
						ev.Tokens = append(ev.Tokens, uint32(rng.IntN(3)))
					}
				}
				if rng.IntN(10) == 0 {
					ev.Extra = make([]uint8, nb)
					ev.Extra[rng.IntN(nb)] = extraOther
				}
				if rng.IntN(20) == 0 {
					ev.Group = 1
				}
				if rng.IntN(30) == 0 {
					ev.Salted = true
				}
				if rng.IntN(30) == 0 {
					ev.Tokens = ev.Tokens[:len(ev.Tokens)-1] // misaligned
				}
				for i, h := range ev.Hashes {
					if i == 0 && ev.HasParent {
						parentOf[h] = ev.Parent
					} else if i > 0 {
						parentOf[h] = ev.Hashes[i-1]
					}
					sh := Event{Group: ev.Group, Salted: ev.Salted, BlockSize: rank, HasLoRAID: len(ev.Tokens) != len(ev.Hashes)*bs}
					if len(ev.Extra) > 0 {
						sh.Extra = []uint8{ev.Extra[i]}
					}
					shapeOf[h] = sh
					if (i+1)*bs <= len(ev.Tokens) {
						tokensOf[h] = ev.Tokens[i*bs : (i+1)*bs]
					} else {
						tokensOf[h] = []uint32{0, 0, 0, 0}
					}
				}
				// The canonical hash each new block has if its chain is matchable (the CPU tier
				// keys' names); the root of an orphan is unknown, so it has none.
				p, ok := local.AdapterSeed(local.AdapterIDOf(base.lora)), true
				if ev.HasParent {
					p, ok = canonOf[ev.Parent]
				}
				for _, h := range ev.Hashes {
					if ok {
						p = local.ChainHash(p, tokensOf[h])
						canonOf[h] = p
					}
				}
				chains = append(chains, chain{append(append([]uint64(nil), base.hashes...), ev.Hashes...), base.lora})
			case op < 55 && len(chains) > 0: // store a known block again (a second physical copy)
				c := chains[rng.IntN(len(chains))]
				i := rng.IntN(len(c.hashes))
				sh := shapeOf[c.hashes[i]]
				ev = Event{Kind: KindStored, BlockSize: bs, Hashes: []uint64{c.hashes[i]}, LoRAName: c.lora,
					Group: sh.Group, Salted: sh.Salted, Extra: sh.Extra}
				rank = sh.BlockSize
				if p := parentOf[c.hashes[i]]; p != 0 {
					ev.Parent, ev.HasParent = p, true
				}
				ev.Tokens = append([]uint32(nil), tokensOf[c.hashes[i]]...)
				if sh.HasLoRAID { // it was published misaligned: the engine would do so again
					ev.Tokens = ev.Tokens[:bs-1]
				}
			case op < 85 && len(chains) > 0: // remove any block
				c := chains[rng.IntN(len(chains))]
				ev = Event{Kind: KindRemoved, Hashes: []uint64{c.hashes[rng.IntN(len(c.hashes))]}}
			case op < 90 && len(chains) > 0: // offload tier: store/remove a CPU copy
				c := chains[rng.IntN(len(chains))]
				ev = Event{Kind: KindStored, Hashes: []uint64{c.hashes[rng.IntN(len(c.hashes))]}, Tier: TierCPU}
				if rng.IntN(2) == 0 {
					ev.Kind = KindRemoved
				}
			case op < 92:
				ev = Event{Kind: KindCleared}
			default:
				ev = Event{Kind: KindRemoved, Hashes: []uint64{1 << 50}} // unknown
			}
			m.Apply(rank, &ev)
			ref.apply(rank, &ev)
			if err := m.check(); err != nil {
				t.Fatalf("seed %d step %d (%v): %v", seed, step, ev.Kind, err)
			}
			// Half way, a checkpoint is written and read back; from then on the restored
			// mirror (its copies confirmed, as after a replayed gap) gets the same events and
			// must agree with the original after each.
			if step == 200 {
				restored, ck, err := ReadCheckpoint(bytes.NewReader(m.AppendCheckpoint(nil, 2, 1.5)), bs, 2)
				if err != nil {
					t.Fatalf("seed %d: read checkpoint: %v", seed, err)
				}
				if ck.EngineStart != 1.5 || len(ck.Ranks) != 2 {
					t.Fatalf("seed %d: checkpoint %+v", seed, ck)
				}
				restored.ConfirmRestored(0)
				restored.ConfirmRestored(1)
				twin = restored
			} else if twin != nil {
				twin.Apply(rank, &ev)
			}
			if twin != nil {
				if err := twin.check(); err != nil {
					t.Fatalf("seed %d step %d: restored mirror: %v", seed, step, err)
				}
				if a, b := sortedSnapshot(m), sortedSnapshot(twin); !slices.Equal(a, b) {
					t.Fatalf("seed %d step %d: restored mirror's summary %x, original %x", seed, step, b, a)
				}
				if twin.MirrorStats().Provisional != 0 {
					t.Fatalf("seed %d: provisional copies after ConfirmRestored", seed)
				}
			}
			all := sortedSnapshot(m)
			got, cpu := splitTierKeys(all, canonOf)
			want := ref.summary()
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d (%+v): summary %x, reference %x", seed, step, ev, got, want)
			}
			evs, head, ok := m.SummarySince(since, nil)
			if !ok {
				t.Fatalf("journal lost events")
			}
			for _, e := range evs {
				if e.Added {
					journalSet[e.Hash] = true
				} else {
					delete(journalSet, e.Hash)
				}
			}
			since = head
			if len(journalSet) != len(all) {
				t.Fatalf("seed %d step %d: journal set %d, snapshot %d", seed, step, len(journalSet), len(all))
			}
			for _, k := range all {
				if !journalSet[k] {
					t.Fatalf("seed %d step %d: snapshot key %x not in the journal's set", seed, step, k)
				}
			}
			// Every CPU tier key names a block the engine holds on the CPU (the reference's
			// copies), by its canonical hash.
			for _, h := range cpu {
				if !ref.holdsOffloaded(h, canonOf) {
					t.Fatalf("seed %d step %d: CPU tier key for %x, which no block holds on the CPU", seed, step, h)
				}
			}
		}
	}
}

// TestMirrorPeek: the peek walks canonical hashes exactly as a router would, stops at an
// evicted interior block, resumes when it is stored again, and counts copies.
func TestMirrorPeek(t *testing.T) {
	const bs = 4
	m := NewCacheMirror(bs)
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{100, 200, 300}, Tokens: prompt[:12], BlockSize: bs})
	if got := m.PeekMatchedTokens(prompt, bs, 0); got != 12 {
		t.Fatalf("peek = %d, want 12", got)
	}
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{200}, Parent: 100, HasParent: true, Tokens: prompt[4:8], BlockSize: bs})
	m.Apply(0, &Event{Kind: KindRemoved, Hashes: []uint64{200}})
	if got := m.PeekMatchedTokens(prompt, bs, 0); got != 12 {
		t.Fatalf("after removing one of two copies: peek = %d, want 12", got)
	}
	m.Apply(0, &Event{Kind: KindRemoved, Hashes: []uint64{200}})
	if got := m.PeekMatchedTokens(prompt, bs, 0); got != 4 {
		t.Fatalf("interior block gone: peek = %d, want 4", got)
	}
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{200}, Parent: 100, HasParent: true, Tokens: prompt[4:8], BlockSize: bs})
	if got := m.PeekMatchedTokens(prompt, bs, 0); got != 12 {
		t.Fatalf("interior block back: peek = %d, want 12", got)
	}
	if got := m.PeekMatchedTokens(prompt, bs, 7); got != 0 {
		t.Fatalf("another adapter: peek = %d, want 0", got)
	}
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{900}, Tokens: prompt[:4], BlockSize: bs, LoRAName: "7"})
	if got := m.PeekMatchedTokens(prompt, bs, 7); got != 4 {
		t.Fatalf("LoRA 7: peek = %d, want 4", got)
	}
	m.Apply(0, &Event{Kind: KindCleared})
	if got, n := m.PeekMatchedTokens(prompt, bs, 0), len(sortedSnapshot(m)); got != 0 || n != 0 {
		t.Fatalf("after clear: peek %d, summary %d", got, n)
	}
	if err := m.check(); err != nil {
		t.Fatal(err)
	}
}
