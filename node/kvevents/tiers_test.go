package kvevents

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
	"github.com/prefixmesh/prefixmesh/local"
)

// Tiers beyond the GPU. Every payload here is a golden written by testdata/conformance_pub.py
// from the publishers' own struct layouts; each test names the upstream file its rule comes from.

// decodeGolden decodes golden name and checks it decoded whole, with no unknown field.
func decodeGolden(t *testing.T, d *Decoder, name string) *Batch {
	t.Helper()
	b, err := d.Decode(1, mustHex(t, goldens[name]))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if b.Malformed != 0 || b.Unknown != 0 || b.Fields != 0 {
		t.Fatalf("%s: batch %+v", name, b)
	}
	return b
}

// checkLower recomputes the lower-tier index from the nodes and compares (besides m.check).
func checkLower(m *CacheMirror) error {
	if err := m.check(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	want := map[uint64][numTiers]uint32{}
	for _, i := range m.byKey {
		n := &m.nodes[i]
		if n.flags&fCanon == 0 {
			continue
		}
		for t := TierGPU + 1; t < numTiers; t++ {
			if n.copies[t] > 0 {
				v := want[n.canon]
				v[t]++
				want[n.canon] = v
			}
		}
	}
	if len(want) != len(m.lower) {
		return fmt.Errorf("lower index has %d hashes, nodes say %d", len(m.lower), len(want))
	}
	for h, v := range want {
		if m.lower[h] != v {
			return fmt.Errorf("lower[%x] = %v, nodes say %v", h, m.lower[h], v)
		}
	}
	return nil
}

// copiesOf returns the copies the mirror holds of rank 0's (group 0) block h, per tier.
func copiesOf(m *CacheMirror, h uint64) [numTiers]uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i, ok := m.byKey[mkey{h, srcOf(0, 0)}]; ok {
		return m.nodes[i].copies
	}
	return [numTiers]uint32{}
}

func tiers(kv ...int) TierTokens {
	var out TierTokens
	for i := 0; i < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// The decoder on every tier golden: mediums, localities and the self-describing chunk's fields
// come out as the publishers wrote them, with no field left unknown.
func TestDecodeTierGoldens(t *testing.T) {
	d := NewDecoder()
	// vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py: a chunk carries its
	// per-block hashes, the whole chunk's tokens, the GPU block size, parent, group and spec.
	b := decodeGolden(t, d, "vllm_cpu_chunks")
	if len(b.Events) != 3 {
		t.Fatalf("events %+v", b.Events)
	}
	c2 := b.Events[2]
	if c2.Tier != TierCPU || len(c2.Hashes) != 4 || c2.Hashes[0] != 103 || len(c2.Tokens) != 16 || c2.BlockSize != 4 ||
		!c2.HasParent || c2.Parent != 102 || c2.Group != 0 || c2.Spec != SpecFull || len(c2.Extra) != 0 {
		t.Fatalf("chunk %+v", c2)
	}
	b = decodeGolden(t, d, "vllm_cpu_evict")
	if e := b.Events[1]; e.Kind != KindRemoved || e.Tier != TierCPU || len(e.Hashes) != 4 {
		t.Fatalf("fan-out removal %+v", e)
	}
	// _placeholder_stored: one hash, no tokens, block size 0.
	b = decodeGolden(t, d, "vllm_placeholders")
	if e := b.Events[0]; e.Tier != TierCPU || len(e.Hashes) != 1 || len(e.Tokens) != 0 || e.BlockSize != 0 || e.HasParent {
		t.Fatalf("placeholder %+v", e)
	}
	// vllm/distributed/kv_events.py: MEDIUM_STORAGE with locality LOCAL or REMOTE.
	b = decodeGolden(t, d, "vllm_storage_locality")
	if b.Events[0].Tier != TierStorage || b.Events[0].Locality != LocalityLocal ||
		b.Events[1].Tier != TierRemote || b.Events[2].Tier != TierRemote || b.Events[2].Kind != KindRemoved {
		t.Fatalf("storage events %+v", b.Events)
	}
	// vllm/v1/kv_offload/mediums.py spells the disk medium "Disk"; array layout.
	b = decodeGolden(t, d, "vllm_array_disk")
	if b.Events[0].Tier != TierDisk || b.Events[1].Tier != TierDisk || b.Events[1].Kind != KindRemoved {
		t.Fatalf("disk events %+v", b.Events)
	}
	// vllm/distributed/kv_transfer/kv_connector/v1/lmcache_connector.py: LMCache's own medium.
	b = decodeGolden(t, d, "lmcache_stored")
	if e := b.Events[0]; e.Tier != TierCPU || len(e.Hashes) != 2 {
		t.Fatalf("lmcache event %+v", e)
	}
	// python/sglang/srt/disaggregation/kv_events.py (HiCache host tiers).
	b = decodeGolden(t, d, "sglang_hicache")
	if b.Events[0].Tier != TierCPU || b.Events[1].Tier != TierCPU || b.Events[2].Tier != TierGPU {
		t.Fatalf("sglang events %+v", b.Events)
	}
}

// A self-describing CPU chunk over blocks the mirror holds on the GPU adds CPU copies to exactly
// those blocks, once per announcement (chunks over an unaligned shared prefix re-announce, and
// consumers reference-count: vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py);
// a GPU eviction keeps a block that has a CPU copy, out of the summary; a CPU removal fans out
// to the chunk's hashes and takes one copy of each.
func TestMirrorOffloadChunks(t *testing.T) {
	d := NewDecoder()
	m := NewCacheMirror(4)
	prompt := make([]uint32, 24)
	for i := range prompt {
		prompt[i] = uint32(i + 1)
	}
	for _, ev := range decodeGolden(t, d, "vllm_cpu_chunks").Events {
		m.Apply(0, &ev)
	}
	want := map[uint64]uint32{101: 1, 102: 1, 103: 2, 104: 2, 105: 1, 106: 1}
	for h, n := range want {
		if c := copiesOf(m, h); c[TierGPU] != 1 || c[TierCPU] != n {
			t.Fatalf("block %d copies %v, want 1 GPU and %d CPU", h, c, n)
		}
	}
	if s := m.MirrorStats(); s.Blocks != 6 || s.Visible != 6 || s.Tiers[TierCPU] != 8 {
		t.Fatalf("stats %+v", s)
	}
	if got := m.PeekMatchedTokensByTier(prompt, 4, 0); got != tiers(int(TierGPU), 24) {
		t.Fatalf("all on the GPU: %v", got)
	}
	if err := checkLower(m); err != nil {
		t.Fatal(err)
	}

	ev := decodeGolden(t, d, "vllm_cpu_evict").Events
	steps := []struct {
		summary int
		peek    TierTokens
		cpu     map[uint64]uint32 // CPU copies left; absent blocks are freed
	}{
		// The GPU evicts 106, 105, 104: they stay (CPU copies), out of the summary; the CPU
		// continues the 12-token GPU prefix by 12.
		{3, tiers(int(TierGPU), 12, int(TierCPU), 12), map[uint64]uint32{101: 1, 102: 1, 103: 2, 104: 2, 105: 1, 106: 1}},
		// Chunk 2's removal fans out to 103..106: 105 and 106 held nothing else and go.
		{3, tiers(int(TierGPU), 12, int(TierCPU), 4), map[uint64]uint32{101: 1, 102: 1, 103: 1, 104: 1}},
		// Chunk 1's: 104 goes; 101..103 keep their GPU copies.
		{3, tiers(int(TierGPU), 12), map[uint64]uint32{101: 0, 102: 0, 103: 0}},
	}
	for i, st := range steps {
		m.Apply(0, &ev[i])
		if err := checkLower(m); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if s := m.MirrorStats(); s.Visible != st.summary || s.Blocks != len(st.cpu) || s.Underrun != 0 {
			t.Fatalf("step %d: stats %+v", i, s)
		}
		if got := m.PeekMatchedTokensByTier(prompt, 4, 0); got != st.peek {
			t.Fatalf("step %d: peek %v, want %v", i, got, st.peek)
		}
		if got := m.PeekMatchedTokens(prompt, 4, 0); got != st.peek[TierGPU] {
			t.Fatalf("step %d: PeekMatchedTokens %d, want the GPU prefix %d", i, got, st.peek[TierGPU])
		}
		for h, n := range st.cpu {
			if c := copiesOf(m, h); c[TierCPU] != n {
				t.Fatalf("step %d: block %d copies %v, want %d CPU", i, h, c, n)
			}
		}
	}
}

// Legacy placeholders (one hash, no tokens, block size 0: _placeholder_stored in
// vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py) add a copy to a block the
// mirror knows and nothing for one it does not; vLLM's "Disk" (vllm/v1/kv_offload/mediums.py)
// is TierDisk.
func TestMirrorPlaceholders(t *testing.T) {
	d := NewDecoder()
	m := NewCacheMirror(4)
	for _, ev := range decodeGolden(t, d, "vllm_cpu_chunks").Events[:1] { // the GPU blocks only
		m.Apply(0, &ev)
	}
	for _, ev := range decodeGolden(t, d, "vllm_placeholders").Events {
		m.Apply(0, &ev)
	}
	if c := copiesOf(m, 102); c[TierCPU] != 1 || c[TierGPU] != 1 {
		t.Fatalf("block 102 copies %v", c)
	}
	s := m.MirrorStats()
	if s.Placeholders != 1 || s.Unknown != 1 || s.Blocks != 6 || s.Visible != 6 || s.Tiers[TierCPU] != 1 {
		t.Fatalf("stats %+v", s)
	}
	ev := decodeGolden(t, d, "vllm_array_disk").Events
	m.Apply(0, &ev[0])
	if c := copiesOf(m, 105); c[TierDisk] != 1 {
		t.Fatalf("block 105 copies %v", c)
	}
	// The CPU copy on 102 does not continue anything: 101 (before it) is on the GPU, so the
	// GPU prefix runs past it; the disk copy on 105 neither.
	prompt := make([]uint32, 24)
	for i := range prompt {
		prompt[i] = uint32(i + 1)
	}
	if got := m.PeekMatchedTokensByTier(prompt, 4, 0); got != tiers(int(TierGPU), 24) {
		t.Fatalf("peek %v", got)
	}
	m.Apply(0, &ev[1])
	if c := copiesOf(m, 105); c[TierDisk] != 0 || m.MirrorStats().Placeholders != 2 {
		t.Fatalf("block 105 copies %v, stats %+v", c, m.MirrorStats())
	}
	if err := checkLower(m); err != nil {
		t.Fatal(err)
	}
}

// vLLM's unified tiering (vllm/distributed/kv_events.py, MEDIUM_STORAGE and locality): a LOCAL
// storage copy and a REMOTE one are distinct tiers, and a REMOTE removal takes only the remote
// copy.
func TestMirrorStorageLocality(t *testing.T) {
	d := NewDecoder()
	m := NewCacheMirror(4)
	ev := decodeGolden(t, d, "vllm_storage_locality").Events
	prompt := make([]uint32, 16)
	for i := range prompt {
		prompt[i] = uint32(i + 1)
	}
	m.Apply(0, &ev[0])
	m.Apply(0, &ev[1])
	if got := m.PeekMatchedTokensByTier(prompt, 4, 0); got != tiers(int(TierStorage), 16, int(TierRemote), 16) {
		t.Fatalf("peek %v", got)
	}
	if s := m.MirrorStats(); s.Visible != 0 || s.Tiers[TierStorage] != 4 || s.Tiers[TierRemote] != 4 {
		t.Fatalf("stats %+v", s)
	}
	m.Apply(0, &ev[2])
	if got := m.PeekMatchedTokensByTier(prompt, 4, 0); got != tiers(int(TierStorage), 16) {
		t.Fatalf("after the remote removal: %v", got)
	}
	if err := checkLower(m); err != nil {
		t.Fatal(err)
	}
}

// LMCache's connector forwards only BlockStored (get_kv_connector_kv_cache_events in
// vllm/distributed/kv_transfer/kv_connector/v1/lmcache_connector.py builds nothing else), so
// its copies age out after the TTL, measured on an injected clock; a tier that has sent a
// removal on the rank is left to its removals; an unknown medium is tracked as TierOther.
func TestMirrorUnremovedTierAgesOut(t *testing.T) {
	d := NewDecoder()
	clock := time.Unix(1700000000, 0)
	now := func() time.Time { return clock }
	m := NewCacheMirror(4)
	m.SetClock(now)
	m.SetUnremovedTTL(time.Minute)
	lm := decodeGolden(t, d, "lmcache_stored").Events[0]
	m.Apply(0, &lm)
	m.Apply(1, &lm) // rank 1 will have a CPU tier that removes
	clock = clock.Add(30 * time.Second)
	m.Apply(1, &Event{Kind: KindRemoved, Hashes: []uint64{77}, Tier: TierCPU}) // names nothing held
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	if got := m.PeekMatchedTokensByTier(prompt, 4, 0); got != tiers(int(TierCPU), 8) {
		t.Fatalf("before the TTL: %v", got)
	}
	clock = clock.Add(30*time.Second - 1)
	if n := m.Expire(); n != 0 {
		t.Fatalf("expired %d copies a nanosecond early", n)
	}
	clock = clock.Add(1)
	if n := m.Expire(); n != 2 {
		t.Fatalf("expired %d copies at the TTL, want rank 0's two", n)
	}
	s := m.MirrorStats()
	if s.AgedOut[TierCPU] != 2 || s.Tiers[TierCPU] != 2 || s.Blocks != 2 {
		t.Fatalf("stats %+v", s)
	}
	if c := copiesOf(m, 101); c != ([numTiers]uint32{}) {
		t.Fatalf("rank 0's block 101 still holds %v", c)
	}
	// Rank 1's copies stay: its CPU tier removes blocks itself.
	if got := m.PeekMatchedTokensByTier(prompt, 4, 0); got != tiers(int(TierCPU), 8) {
		t.Fatalf("rank 1's copies: %v", got)
	}
	// An unknown medium is tracked, answered as TierOther, and ages like any unremoved tier.
	ext := Event{Kind: KindStored, Hashes: []uint64{5}, Tokens: []uint32{9, 9, 9, 9}, BlockSize: 4, Tier: tierOf("EXTERNAL")}
	m.Apply(0, &ext)
	if got := m.PeekMatchedTokensByTier([]uint32{9, 9, 9, 9}, 4, 0); got != tiers(int(TierOther), 4) {
		t.Fatalf("unknown medium: %v", got)
	}
	clock = clock.Add(time.Minute)
	if got := m.PeekMatchedTokensByTier([]uint32{9, 9, 9, 9}, 4, 0); got != (TierTokens{}) {
		t.Fatalf("the peek answered an expired copy: %v", got)
	}
	if err := checkLower(m); err != nil {
		t.Fatal(err)
	}
	// A cleared rank's pending entries go with it: a copy stored after the clear is not taken
	// by an entry of the one before.
	m.Apply(0, &lm)
	clock = clock.Add(30 * time.Second)
	m.Clear(0)
	m.Apply(0, &lm)
	clock = clock.Add(30 * time.Second)
	if n := m.Expire(); n != 0 {
		t.Fatalf("an entry from before the clear expired %d copies", n)
	}
	if err := checkLower(m); err != nil {
		t.Fatal(err)
	}
}

// A lower tier only continues the GPU prefix: a block held after a gap is never counted.
func TestPeekByTierNoGap(t *testing.T) {
	m := NewCacheMirror(4)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{1, 2, 3, 4}, Tokens: toks, BlockSize: 4})
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{2, 3, 4}, Parent: 1, HasParent: true, Tokens: toks[4:], BlockSize: 4, Tier: TierCPU})
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{4}, Parent: 3, HasParent: true, Tokens: toks[12:], BlockSize: 4, Tier: TierDisk})
	m.Apply(0, &Event{Kind: KindRemoved, Hashes: []uint64{4, 3, 2}})          // the GPU keeps block 1
	m.Apply(0, &Event{Kind: KindRemoved, Hashes: []uint64{3}, Tier: TierCPU}) // the CPU loses block 3
	if got := m.PeekMatchedTokensByTier(toks, 4, 0); got != tiers(int(TierGPU), 4, int(TierCPU), 4) {
		t.Fatalf("peek %v: the CPU stops at its gap (block 3), the disk's block 4 follows a gap", got)
	}
	if got := m.PeekMatchedTokensByTier(toks[:6], 4, 0); got != tiers(int(TierGPU), 4, int(TierCPU), 0) {
		t.Fatalf("partial block: %v", got)
	}
	if got := m.PeekMatchedTokensByTier(toks, 0, 0); got != (TierTokens{}) {
		t.Fatalf("block size 0: %v", got)
	}
	if err := checkLower(m); err != nil {
		t.Fatal(err)
	}
}

// TestAllocsPeekByTier: the per-tier peek allocates nothing.
func TestAllocsPeekByTier(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	m, toks := peekByTierMirror()
	if n := testing.AllocsPerRun(100, func() { m.PeekMatchedTokensByTier(toks, 16, 0) }); n != 0 {
		t.Fatalf("PeekMatchedTokensByTier allocated %.1f times, want 0", n)
	}
}

// The new counters exist at 0 for every tier from the first scrape, and count.
func TestTierMetrics(t *testing.T) {
	m := NewCacheMirror(4)
	reg := prometheus.NewRegistry()
	reg.MustRegister(mirrorCollector{m})
	gather := func() map[string]*dto.MetricFamily {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			out[f.GetName()] = f
		}
		return out
	}
	fams := gather()
	for name, n := range map[string]int{"prefixmesh_kvevents_aged_out_copies_total": NumTiers,
		"prefixmesh_kvevents_block_copies": NumTiers, "prefixmesh_kvevents_placeholders_total": 1} {
		if f := fams[name]; f == nil || len(f.Metric) != n {
			t.Fatalf("%s: %v, want %d series", name, f, n)
		}
	}
	var labels bytes.Buffer
	for _, s := range fams["prefixmesh_kvevents_block_copies"].Metric {
		fmt.Fprintf(&labels, "%s ", s.Label[0].GetValue())
	}
	if labels.String() != "cpu disk gpu other remote storage " {
		t.Fatalf("tier labels %q", labels.String())
	}
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{1}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 4})
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{1}, Tier: TierCPU})
	if v := gather()["prefixmesh_kvevents_placeholders_total"].Metric[0].GetCounter().GetValue(); v != 1 {
		t.Fatalf("placeholders_total %v", v)
	}
}

// A checkpoint carries lower-tier copies: the restored mirror answers the same per-tier peek.
func TestCheckpointLowerTiers(t *testing.T) {
	m, toks := peekByTierMirror()
	want := m.PeekMatchedTokensByTier(toks, 16, 0)
	r, _, err := ReadCheckpoint(bytes.NewReader(m.AppendCheckpoint(nil, 1, 0)), 16, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.PeekMatchedTokensByTier(toks, 16, 0); got != want || want[TierCPU] == 0 {
		t.Fatalf("restored peek %v, want %v", got, want)
	}
	if err := checkLower(r); err != nil {
		t.Fatal(err)
	}
}

// peekByTierMirror holds a 2,048-token prompt: its first half on the GPU, all of it on the CPU.
func peekByTierMirror() (*CacheMirror, []uint32) {
	m := NewCacheMirror(16)
	toks := make([]uint32, 2048)
	for i := range toks {
		toks[i] = uint32(i)
	}
	hs := make([]uint64, 128)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	m.Apply(0, &Event{Kind: KindStored, Hashes: hs, Tokens: toks, BlockSize: 16})
	m.Apply(0, &Event{Kind: KindStored, Hashes: hs, Tokens: toks, BlockSize: 16, Tier: TierCPU})
	m.Apply(0, &Event{Kind: KindRemoved, Hashes: hs[64:]})
	return m, toks
}

// TestSummaryTierKeys: a block's copy on a lower tier is in the summary under its tier key
// (local.TierKey) from its first copy there to its last, independent of its GPU copy; the
// journal says so in order, and the snapshot agrees. The expected keys are computed here from the
// tokens with local's canonical hash, not read from the mirror.
func TestSummaryTierKeys(t *testing.T) {
	m := NewCacheMirror(4)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	h1 := local.ChainHash(0, toks[:4])
	h2 := local.ChainHash(h1, toks[4:])
	cpu2, disk2 := local.TierKey(h2, local.TierCPU), local.TierKey(h2, local.TierDisk)
	if cpu2 == h2 || cpu2 == disk2 {
		t.Fatalf("tier keys %x %x collide with %x", cpu2, disk2, h2)
	}
	var since uint64
	step := func(ev Event, want ...local.SummaryEvent) {
		t.Helper()
		m.Apply(0, &ev)
		got, head, ok := m.SummarySince(since, nil)
		if !ok {
			t.Fatal("journal lost events")
		}
		since = head
		for i := range got {
			got[i].Seq = 0
		}
		if !slices.Equal(got, want) {
			t.Fatalf("after %v on %v: journal %+v, want %+v", ev.Kind, ev.Tier, got, want)
		}
	}
	add := func(k uint64) local.SummaryEvent { return local.SummaryEvent{Hash: k, Added: true} }
	del := func(k uint64) local.SummaryEvent { return local.SummaryEvent{Hash: k} }
	step(Event{Kind: KindStored, Hashes: []uint64{1, 2}, Tokens: toks, BlockSize: 4}, add(h1), add(h2))
	step(Event{Kind: KindStored, Hashes: []uint64{2}, Parent: 1, HasParent: true, Tokens: toks[4:], BlockSize: 4, Tier: TierCPU}, add(cpu2))
	step(Event{Kind: KindStored, Hashes: []uint64{2}, Parent: 1, HasParent: true, Tokens: toks[4:], BlockSize: 4, Tier: TierCPU}) // a second copy: no change
	step(Event{Kind: KindStored, Hashes: []uint64{2}, Tier: TierDisk}, add(disk2))                                                // a placeholder on a known block
	step(Event{Kind: KindStored, Hashes: []uint64{2}, Tier: TierOther})                                                           // never published
	step(Event{Kind: KindRemoved, Hashes: []uint64{2}}, del(h2))                                                                  // the GPU evicts; the lower copies stay
	step(Event{Kind: KindRemoved, Hashes: []uint64{2}, Tier: TierCPU})                                                            // one of two CPU copies
	snap, _ := m.SummarySnapshot(nil)
	slices.Sort(snap)
	want := []uint64{h1, cpu2, disk2}
	slices.Sort(want)
	if !slices.Equal(snap, want) {
		t.Fatalf("snapshot %x, want %x", snap, want)
	}
	step(Event{Kind: KindRemoved, Hashes: []uint64{2}, Tier: TierCPU}, del(cpu2))
	step(Event{Kind: KindCleared}, del(h1), del(disk2))
}
