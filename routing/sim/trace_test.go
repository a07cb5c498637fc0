package sim

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestExpandMooncake(t *testing.T) {
	for _, n := range []int{0, 1, 511, 512, 513, 1024, 1500} {
		ids := make([]int64, (n+511)/512)
		for i := range ids {
			ids[i] = int64(i)
		}
		toks, err := ExpandMooncake(ids, n)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if len(toks) != n {
			t.Fatalf("n=%d: got %d tokens", n, len(toks))
		}
		for _, tok := range toks {
			if tok >= Vocab {
				t.Fatalf("token %d out of vocabulary", tok)
			}
		}
	}
	if _, err := ExpandMooncake([]int64{1}, 513); !errors.Is(err, ErrBadTrace) {
		t.Fatalf("too few ids: err = %v, want ErrBadTrace", err)
	}
	if _, err := ExpandMooncake([]int64{-1}, 3); !errors.Is(err, ErrBadTrace) {
		t.Fatalf("negative id: err = %v, want ErrBadTrace", err)
	}
}

func TestExpandMooncakePrefixes(t *testing.T) {
	a, _ := ExpandMooncake([]int64{7, 8, 9}, 1300)
	b, _ := ExpandMooncake([]int64{7, 8, 10}, 1400)
	c, _ := ExpandMooncake([]int64{6, 8, 9}, 1300)
	// Equal hash_id prefixes give equal token prefixes…
	if !slices.Equal(a[:1024], b[:1024]) {
		t.Fatal("equal hash_id prefix gave different tokens")
	}
	// …and a different id gives different tokens in every 16-token chunk of its block.
	for i := 1024; i+16 <= 1300; i += 16 {
		if slices.Equal(a[i:i+16], b[i:i+16]) {
			t.Fatalf("blocks 9 and 10 agree on chunk at %d", i)
		}
	}
	for i := 0; i+16 <= 512; i += 16 {
		if slices.Equal(a[i:i+16], c[i:i+16]) {
			t.Fatalf("blocks 7 and 6 agree on chunk at %d", i)
		}
	}
	// Deterministic.
	again, _ := ExpandMooncake([]int64{7, 8, 9}, 1300)
	if !slices.Equal(a, again) {
		t.Fatal("expansion not deterministic")
	}
}

const mooncakeSample = `{"timestamp": 0, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}
{"timestamp": 0, "input_length": 100, "output_length": 4, "hash_ids": [2]}

{"timestamp": 1500, "input_length": 1024, "output_length": 9, "hash_ids": [0, 3]}
`

func TestReadMooncake(t *testing.T) {
	tr, err := ReadMooncake(strings.NewReader(mooncakeSample), ReadOptions{Speed: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Requests) != 3 {
		t.Fatalf("got %d requests", len(tr.Requests))
	}
	r := tr.Requests
	if len(r[0].Tokens) != 600 || len(r[1].Tokens) != 100 || len(r[2].Tokens) != 1024 {
		t.Fatalf("lengths %d %d %d", len(r[0].Tokens), len(r[1].Tokens), len(r[2].Tokens))
	}
	if r[2].Arrival != 750*time.Millisecond || r[1].Arrival != 0 {
		t.Fatalf("arrivals %v %v (speed 2)", r[1].Arrival, r[2].Arrival)
	}
	if r[0].OutputTokens != 6 || r[2].OutputTokens != 9 {
		t.Fatal("output lengths")
	}
	if !slices.Equal(r[0].Tokens[:512], r[2].Tokens[:512]) || slices.Equal(r[0].Tokens[512:600], r[2].Tokens[512:600]) {
		t.Fatal("prefix structure lost")
	}
	lim, err := ReadMooncake(strings.NewReader(mooncakeSample), ReadOptions{Limit: 2})
	if err != nil || len(lim.Requests) != 2 {
		t.Fatalf("limit: %v, %d", err, len(lim.Requests))
	}
	if _, err := ReadMooncake(strings.NewReader(`{"input_length": 5, "hash_ids": [1]}`), ReadOptions{}); !errors.Is(err, ErrBadTrace) {
		t.Fatalf("missing timestamp: err = %v", err)
	}
	if _, err := ReadMooncake(strings.NewReader(`{"timestamp": 1, `), ReadOptions{}); !errors.Is(err, ErrBadTrace) {
		t.Fatalf("bad json: err = %v", err)
	}
}

const azureSample = `TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:04.0781490,110,27
2023-11-16 18:17:05.0781490,5000,3
2023-11-16 18:17:06.0781490,6000,3
2023-11-16 18:17:07.0781490,7000,3
`

func TestReadAzure(t *testing.T) {
	opt := DefaultReadOptions()
	opt.Seed = 1
	opt.SessionShare = 1 // every later request continues a conversation when one fits
	tr, err := ReadAzure(strings.NewReader(azureSample), opt)
	if err != nil {
		t.Fatal(err)
	}
	want := []int{4808, 3180, 110, 5000, 6000, 7000}
	if len(tr.Requests) != len(want) {
		t.Fatalf("got %d requests", len(tr.Requests))
	}
	for i, r := range tr.Requests {
		if len(r.Tokens) != want[i] {
			t.Fatalf("request %d: %d tokens, want %d", i, len(r.Tokens), want[i])
		}
		if r.SessionKey == 0 {
			t.Fatalf("request %d has no session", i)
		}
	}
	if got := tr.Requests[1].Arrival; got != 52*time.Millisecond {
		t.Fatalf("arrival %v, want 52ms", got)
	}
	// With SessionShare 1, rows 3–5 fit every open conversation, so each continues one: some
	// earlier prompt is a prefix of theirs.
	for i := 3; i < len(tr.Requests); i++ {
		cont := false
		for j := 0; j < i; j++ {
			a, b := tr.Requests[i].Tokens, tr.Requests[j].Tokens
			if slices.Equal(a[:len(b)], b) && tr.Requests[i].SessionKey == tr.Requests[j].SessionKey {
				cont = true
			}
		}
		if !cont {
			t.Fatalf("request %d continues no conversation", i)
		}
	}
	again, _ := ReadAzure(strings.NewReader(azureSample), opt)
	for i := range tr.Requests {
		if !slices.Equal(tr.Requests[i].Tokens, again.Requests[i].Tokens) {
			t.Fatal("synthetic structure not deterministic for a fixed seed")
		}
	}
	plain, err := ReadAzure(strings.NewReader(azureSample), ReadOptions{Limit: 3})
	if err != nil || len(plain.Requests) != 3 || len(plain.Requests[0].Tokens) != 4808 {
		t.Fatalf("plain: %v", err)
	}
	if _, err := ReadAzure(strings.NewReader("2023-11-16 18:17:03,x,1\n"), ReadOptions{}); !errors.Is(err, ErrBadTrace) {
		t.Fatalf("bad count: err = %v", err)
	}
}

// Arrivals round down to multiples of the quantum, in the same order.
func TestQuantizeArrivals(t *testing.T) {
	tr := &Trace{Requests: []Request{{Arrival: 0}, {Arrival: 999 * time.Millisecond}, {Arrival: time.Second},
		{Arrival: 2999 * time.Millisecond}, {Arrival: 3001 * time.Millisecond}}}
	if err := tr.QuantizeArrivals(time.Second); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, 0, time.Second, 2 * time.Second, 3 * time.Second}
	for i, r := range tr.Requests {
		if r.Arrival != want[i] {
			t.Fatalf("arrival %d: %v, want %v", i, r.Arrival, want[i])
		}
	}
	if err := tr.QuantizeArrivals(0); !errors.Is(err, ErrBadTrace) {
		t.Fatalf("quantum 0: %v", err)
	}
}
