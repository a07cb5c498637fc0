package kvevents

import (
	"encoding/json"
	"os/exec"
	"testing"
)

// TestGoldensFromPublisher: the golden payloads are what the conformance publisher writes (so
// they come from an encoder laid out by the publishers' sources, not from this package's
// Encoder or its description).
func TestGoldensFromPublisher(t *testing.T) {
	requirePython(t)
	out, err := exec.Command(systemPython, pyPublisher, "--golden").Output()
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(goldens) {
		t.Fatalf("publisher writes %d goldens, the test holds %d", len(got), len(goldens))
	}
	for k, v := range goldens {
		if got[k] != v {
			t.Errorf("%s: publisher writes %s, golden %s", k, got[k], v)
		}
	}
}

// TestDecodeGoldens decodes each golden and checks the fields the publisher put in.
func TestDecodeGoldens(t *testing.T) {
	d := NewDecoder()
	dec := func(name string) *Batch {
		t.Helper()
		b, err := d.Decode(1, mustHex(t, goldens[name]))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b.TS != 1700000000.5 || b.Malformed != 0 || b.Unknown != 0 || b.Fields != 0 {
			t.Fatalf("%s: batch %+v", name, b)
		}
		return b
	}

	// vLLM's map layout: the batch is a map too; group and spec fields decoded.
	b := dec("vllm_map_hybrid")
	if !b.HasRank || b.Rank != 0 || len(b.Events) != 3 {
		t.Fatalf("batch %+v", b)
	}
	full, swa, rem := b.Events[0], b.Events[1], b.Events[2]
	if full.Kind != KindStored || full.Hashes[0] != 1<<64-1 || full.Hashes[1] != 17 || full.HasParent || full.Group != 0 ||
		full.Spec != SpecFull || full.Window != 0 || full.Tier != TierGPU || len(full.Tokens) != 8 || full.BlockSize != 4 {
		t.Fatalf("full attention event %+v", full)
	}
	if swa.Group != 1 || swa.Spec != SpecSliding || swa.Window != 128 || swa.Hashes[0] != 901 {
		t.Fatalf("sliding window event %+v", swa)
	}
	if rem.Kind != KindRemoved || rem.Group != 1 || rem.Hashes[0] != 902 || rem.Tier != TierGPU {
		t.Fatalf("removed event %+v", rem)
	}

	// The array_like layout with other spellings of medium: "gpu", "CPU_PINNED", nil, "cpu".
	b = dec("vllm_array_mediums")
	if !b.HasRank || b.Rank != 1 || len(b.Events) != 5 {
		t.Fatalf("batch %+v", b)
	}
	wantTier := []Tier{TierGPU, TierCPU, TierGPU, TierCPU}
	for i, w := range wantTier {
		if b.Events[i].Tier != w {
			t.Fatalf("event %d tier %v, want %v", i, b.Events[i].Tier, w)
		}
	}
	if !b.Events[1].HasParent || b.Events[1].Parent != 5 || b.Events[4].Kind != KindCleared {
		t.Fatalf("events %+v", b.Events)
	}

	// "No parent" as the integer 0, in both layouts.
	for _, name := range []string{"parent_zero_array", "parent_zero_map"} {
		b = dec(name)
		if len(b.Events) != 1 || b.Events[0].HasParent || b.Events[0].Hashes[0] != 11 {
			t.Fatalf("%s: %+v", name, b.Events)
		}
	}

	// SGLang's signed hashes (two's complement keys) and vLLM's byte digests (last 8 bytes).
	b = dec("sglang_negative")
	if e := b.Events[0]; e.Hashes[0] != ^uint64(1) || e.Hashes[1] != ^uint64(2) {
		t.Fatalf("sglang hashes %x", e.Hashes)
	}
	b = dec("vllm_bytes")
	if e := b.Events[0]; e.Hashes[0] != 0x18191a1b1c1d1e1f {
		t.Fatalf("bytes hash %x", e.Hashes)
	}
}

// A hybrid model's hit stops where any KV-cache group lacks the block (vLLM's
// HybridKVCacheCoordinator.find_longest_cache_hit shortens the full-attention hit to what every
// group accepts): the golden stores two blocks in group 0 (full attention) and the same two in
// group 1 (sliding window), then removes group 1's second one. The credit is one block.
func TestMirrorHybridGoldens(t *testing.T) {
	d := NewDecoder()
	b, err := d.Decode(1, mustHex(t, goldens["vllm_map_hybrid"]))
	if err != nil {
		t.Fatal(err)
	}
	m := NewCacheMirror(4)
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	m.Apply(0, &b.Events[0])
	if got := m.PeekMatchedTokens(tokens, 4, 0); got != 8 {
		t.Fatalf("full attention alone: %d, want 8", got)
	}
	m.Apply(0, &b.Events[1])
	if got := m.PeekMatchedTokens(tokens, 4, 0); got != 8 {
		t.Fatalf("both groups hold both blocks: %d, want 8", got)
	}
	m.Apply(0, &b.Events[2])
	if got := m.PeekMatchedTokens(tokens, 4, 0); got != 4 {
		t.Fatalf("the sliding-window group lost block 2: %d, want 4", got)
	}
	if err := m.check(); err != nil {
		t.Fatal(err)
	}
	if s := sortedSnapshot(m); len(s) != 1 {
		t.Fatalf("summary %x, want one hash", s)
	}
}
