package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// The spec's smoke vectors (computed with Debian python3-msgpack in msgspec's layout).
const (
	legacyStoredHex = "93cb41d954fc402000009198ab426c6f636b53746f72656491cf8000000000000005c0940102030404c0a3475055c000"
	mapClearedHex   = "93cb41d954fc402000009181a474797065b0416c6c426c6f636b73436c656172656400"
)

func mustHex(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeSpecVectors(t *testing.T) {
	d := NewDecoder()
	b, err := d.Decode(7, mustHex(t, legacyStoredHex))
	if err != nil {
		t.Fatal(err)
	}
	if b.Seq != 7 || b.TS != 1700000000.5 || !b.HasRank || b.Rank != 0 || len(b.Events) != 1 {
		t.Fatalf("batch = %+v", b)
	}
	ev := b.Events[0]
	if ev.Kind != KindStored || len(ev.Hashes) != 1 || ev.Hashes[0] != 1<<63+5 || ev.HasParent ||
		len(ev.Tokens) != 4 || ev.Tokens[3] != 4 || ev.BlockSize != 4 || ev.Tier != TierGPU || ev.LoRAName != "" {
		t.Fatalf("event = %+v", ev)
	}
	b, err = d.Decode(8, mustHex(t, mapClearedHex))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 1 || b.Events[0].Kind != KindCleared {
		t.Fatalf("batch = %+v", b)
	}
}

func enc(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeShapes(t *testing.T) {
	toks := []any{1, 2, 3, 4, 5, 6, 7, 8}
	cases := []struct {
		name  string
		batch any
		check func(t *testing.T, b *Batch)
	}{
		{"map events, signed and bytes hashes, unknown tag and field", []any{1.0, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{int64(-2), []byte{9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7}},
				"parent_block_hash": nil, "token_ids": toks, "block_size": 4, "medium": "gpu", "lora_name": "ad",
				"extra_keys": []any{[]any{"ad"}, []any{"ad", "img", 3}}, "group_idx": 0, "future_field": 1},
			map[string]any{"type": "BlockInactive", "block_hashes": []any{1}},
			[]any{"BlockRemoved", []any{uint8(5)}, "CPU_TIER1", 2, "extra"},
		}}, func(t *testing.T, b *Batch) {
			if len(b.Events) != 2 || b.Unknown != 1 || b.Fields < 2 || b.HasRank {
				t.Fatalf("batch %+v", b)
			}
			s := b.Events[0]
			if s.Hashes[0] != ^uint64(1) || s.Hashes[1] != 7 || s.LoRAName != "ad" || s.Extra[0] != extraLoRA || s.Extra[1] != extraOther {
				t.Fatalf("stored %+v", s)
			}
			r := b.Events[1]
			if r.Kind != KindRemoved || r.Hashes[0] != 5 || r.Tier != TierCPU || r.Group != 2 {
				t.Fatalf("removed %+v", r)
			}
		}},
		{"map batch with attn_dp_rank", map[string]any{"ts": 2, "events": []any{[]any{"AllBlocksCleared"}}, "attn_dp_rank": 3},
			func(t *testing.T, b *Batch) {
				if !b.HasRank || b.Rank != 3 || len(b.Events) != 1 || b.Events[0].Kind != KindCleared {
					t.Fatalf("batch %+v", b)
				}
			}},
		{"sglang salted positional map at index 7", []any{1.0, []any{
			[]any{"BlockStored", []any{11}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", map[string]any{"cache_salt": "s"}},
		}, 0}, func(t *testing.T, b *Batch) {
			if len(b.Events) != 1 || !b.Events[0].Salted {
				t.Fatalf("batch %+v", b)
			}
		}},
		{"malformed event is skipped, batch applies", []any{1.0, []any{
			[]any{"BlockStored", []any{"x"}, nil, []any{-1}, 4},
			[]any{"BlockRemoved", []any{3}},
		}, 0}, func(t *testing.T, b *Batch) {
			if len(b.Events) != 1 || b.Malformed != 1 || b.Events[0].Kind != KindRemoved {
				t.Fatalf("batch %+v", b)
			}
		}},
	}
	d := NewDecoder()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := d.Decode(1, enc(t, c.batch))
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, b)
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	d := NewDecoder()
	for name, p := range map[string][]byte{
		"empty":       {},
		"not a batch": enc(t, 5),
		"one element": enc(t, []any{1.0}),
		"truncated":   mustHex(t, legacyStoredHex)[:20],
		"huge tokens": mustHex(t, "9301dd7fffffff"),
		// A BlockStored whose hash is a 3.4 GB extension: refused before reading (the
		// library's own Skip would read it chunk by chunk; found by fuzzing).
		"huge ext hash": mustHex(t, "93cbbfd954fc4020d7009198ab426c6f636b53746f72656491c9cf0000000093cb412954fc402000009181a474797065b0416c6c426c6f636b73436c656172656400"),
		"deep nesting":  append(mustHex(t, "930191"), bytes.Repeat([]byte{0x91}, 100)...),
	} {
		if _, err := d.Decode(0, p); !errors.Is(err, ErrPayload) {
			t.Errorf("%s: err = %v, want ErrPayload", name, err)
		}
	}
	if _, err := DecodeSeq([]byte{1, 2}); !errors.Is(err, ErrSeq) {
		t.Errorf("DecodeSeq: %v", err)
	}
}

// TestEncodeRoundTrip: the Encoder's every layout and hash format decodes to what it encoded.
func TestEncodeRoundTrip(t *testing.T) {
	events := []Event{
		{Kind: KindStored, Hashes: []uint64{1 << 63, 42}, Parent: 9, HasParent: true, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, LoRAName: "7"},
		{Kind: KindStored, Hashes: []uint64{5}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 4, Group: 1},
		{Kind: KindRemoved, Hashes: []uint64{42}, Tier: TierCPU},
		{Kind: KindCleared},
	}
	d := NewDecoder()
	for _, layout := range []Layout{LayoutArray, LayoutMap} {
		for _, hf := range []HashFormat{HashInt, HashBytes} {
			e := NewEncoder(layout, hf)
			b, err := d.Decode(3, e.Encode(1.5, events, 2))
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != len(events) || b.Rank != 2 || b.Unknown+b.Malformed+b.Fields != 0 {
				t.Fatalf("layout %d hashes %d: %+v", layout, hf, b)
			}
			for i, want := range events {
				got := b.Events[i]
				if got.Kind != want.Kind || !equalU64(got.Hashes, want.Hashes) || got.Parent != want.Parent ||
					got.HasParent != want.HasParent || len(got.Tokens) != len(want.Tokens) || got.BlockSize != want.BlockSize ||
					got.LoRAName != want.LoRAName || got.Group != want.Group || got.Tier != want.Tier {
					t.Fatalf("layout %d hashes %d event %d: got %+v want %+v", layout, hf, i, got, want)
				}
			}
		}
	}
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzDecode: any payload either decodes or fails with ErrPayload/ErrTooBig; a decoded batch
// applies to a mirror without panicking and leaves it consistent.
func FuzzDecode(f *testing.F) {
	f.Add(mustHex(f, legacyStoredHex))
	f.Add(mustHex(f, mapClearedHex))
	e := NewEncoder(LayoutMap, HashBytes)
	f.Add(append([]byte(nil), e.Encode(1, []Event{{Kind: KindStored, Hashes: []uint64{1, 2}, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4}, {Kind: KindRemoved, Hashes: []uint64{1}}}, 0)...))
	e = NewEncoder(LayoutArray, HashInt)
	f.Add(append([]byte(nil), e.Encode(1, []Event{{Kind: KindStored, Hashes: []uint64{1}, Parent: 2, HasParent: true, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 4, Group: 1}}, 0)...))
	d := NewDecoder()
	f.Fuzz(func(t *testing.T, payload []byte) {
		m := NewCacheMirror(4)
		b, err := d.Decode(0, payload)
		if err != nil {
			if !errors.Is(err, ErrPayload) && !errors.Is(err, ErrTooBig) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		for i := range b.Events {
			m.Apply(0, &b.Events[i])
		}
		if err := m.check(); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzParseReplay: any replay frame set parses or errors, never panics.
func FuzzParseReplay(f *testing.F) {
	f.Add([]byte{}, []byte{0, 0, 0, 0, 0, 0, 0, 1}, []byte{0x90}, true)
	f.Add([]byte("topic"), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte{}, false)
	f.Fuzz(func(t *testing.T, a, b, c []byte, four bool) {
		frames := [][]byte{{}, a, b, c}
		if !four {
			frames = frames[:3]
		}
		_, _, _ = parseReplay(frames)
	})
}
