package sim

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// The same options give the same trace; another seed draws other lengths and offsets.
func TestForkDeterministic(t *testing.T) {
	o := DefaultForkOptions()
	o.Forks, o.Seed = 3, 7
	a, err := Fork(o)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Fork(o)
	o.Seed = 8
	c, _ := Fork(o)
	same := func(x, y *Trace) bool {
		return slices.EqualFunc(x.Requests, y.Requests, func(p, q Request) bool {
			return p.Arrival == q.Arrival && p.OutputTokens == q.OutputTokens && slices.Equal(p.Tokens, q.Tokens)
		})
	}
	if !same(a, b) {
		t.Fatal("two traces from the same options differ")
	}
	if same(a, c) {
		t.Fatal("seeds 7 and 8 gave the same trace")
	}
}

// Shape: per fork a root at k·gap then its branches within [lead, lead+burst); every prompt of a
// fork starts with the fork's prefix and then differs from its siblings' at once; forks share
// nothing; lengths within their ranges; sorted by arrival; no session keys.
func TestForkShape(t *testing.T) {
	o := ForkOptions{Forks: 4, Prefix: 1000, Branches: 5, SuffixMin: 10, SuffixMax: 20, OutputMin: 3, OutputMax: 6,
		RootOutput: 9, Lead: time.Second, Burst: 100 * time.Millisecond, Gap: 5 * time.Second, Seed: 1}
	tr, err := Fork(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Requests) != 4*6 {
		t.Fatalf("%d requests, want 24", len(tr.Requests))
	}
	if !slices.IsSortedFunc(tr.Requests, func(a, b Request) int { return int(a.Arrival - b.Arrival) }) {
		t.Fatal("not sorted by arrival")
	}
	firsts := map[uint32]bool{}
	for k := 0; k < 4; k++ {
		fork := tr.Requests[6*k : 6*k+6] // forks 5 s apart never interleave
		root := fork[0]
		if root.Arrival != time.Duration(k)*5*time.Second || root.OutputTokens != 9 {
			t.Fatalf("fork %d root at %v with %d outputs", k, root.Arrival, root.OutputTokens)
		}
		prefix := root.Tokens[:1000]
		if firsts[prefix[0]] {
			t.Fatalf("fork %d's prefix starts like another fork's", k)
		}
		firsts[prefix[0]] = true
		seen := map[uint32]bool{}
		for i, r := range fork {
			if n := len(r.Tokens) - 1000; n < 10 || n > 20 {
				t.Fatalf("fork %d request %d: suffix of %d tokens", k, i, n)
			}
			if !slices.Equal(r.Tokens[:1000], prefix) {
				t.Fatalf("fork %d request %d does not start with the fork's prefix", k, i)
			}
			if seen[r.Tokens[1000]] {
				t.Fatalf("fork %d request %d: suffix starts like a sibling's", k, i)
			}
			seen[r.Tokens[1000]] = true
			if r.SessionKey != 0 {
				t.Fatalf("session key %d", r.SessionKey)
			}
			if i == 0 {
				continue
			}
			if lo := root.Arrival + time.Second; r.Arrival < lo || r.Arrival >= lo+100*time.Millisecond {
				t.Fatalf("fork %d branch %d at %v", k, i, r.Arrival)
			}
			if r.OutputTokens < 3 || r.OutputTokens > 6 {
				t.Fatalf("fork %d branch %d: %d outputs", k, i, r.OutputTokens)
			}
		}
	}
}

// Specs: defaults, every key, the read options, and refusals.
func TestParseFork(t *testing.T) {
	o, err := ParseFork("fork", 5)
	if d := DefaultForkOptions(); err != nil || o.Seed != 5 || o.Forks != d.Forks || o.Prefix != d.Prefix {
		t.Fatalf("fork: %+v, %v", o, err)
	}
	o, err = ParseFork("fork:forks=2,prefix=8192,branches=64,suffix=300,output=10-20,root-output=5,lead=1s,burst=50ms,gap=3s,seed=9", 5)
	want := ForkOptions{Forks: 2, Prefix: 8192, Branches: 64, SuffixMin: 300, SuffixMax: 300, OutputMin: 10, OutputMax: 20,
		RootOutput: 5, Lead: time.Second, Burst: 50 * time.Millisecond, Gap: 3 * time.Second, Seed: 9}
	if err != nil || o != want {
		t.Fatalf("got %+v, %v; want %+v", o, err, want)
	}
	tr, err := ForkTrace("fork:forks=2,branches=3,gap=4s", ReadOptions{Speed: 2, Limit: 5})
	if err != nil || len(tr.Requests) != 5 || tr.Requests[4].Arrival != 2*time.Second {
		t.Fatalf("speed 2, limit 5: %v, %v", tr, err)
	}
	for _, bad := range []string{"forks", "fork:x=1", "fork:forks", "fork:forks=0", "fork:suffix=9-3",
		"fork:gap=-1s", "fork:prefix=999999", "fork:forks=1048576"} {
		if _, err := ParseFork(bad, 0); !errors.Is(err, ErrBadTrace) {
			t.Errorf("%q: %v, want ErrBadTrace", bad, err)
		}
	}
}
