package local

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// TestConcurrent runs many goroutines through correct caller usage (lookup → insert → release,
// pin → release, cold insert → release, peeks, evictions) on one tree while another follows its
// summary journal, then checks the structure, the balance (every node back to ref 1), the owned-
// block ledger and that the replica equals the snapshot. Run it with -race.
func TestConcurrent(t *testing.T) {
	const workers = 8
	iters := 3000
	if testing.Short() || raceEnabled {
		iters = 800
	}
	tr := NewRadixTree(Options{JournalCapacity: 256})
	docs := make([][]uint32, 6)
	dr := rand.New(rand.NewPCG(1, 2))
	for i := range docs {
		docs[i] = make([]uint32, 256)
		for j := range docs[i] {
			docs[i][j] = uint32(dr.IntN(4))
		}
	}
	ledgers := make([]map[uint32]int, workers)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	replicaErr := make(chan error, 1)
	go func() { // the gossip side: follow the journal, resynchronise when it falls behind
		r := newSummaryReplica()
		for {
			if err := r.sync(tr); err != nil {
				replicaErr <- err
				return
			}
			select {
			case <-stop:
				replicaErr <- nil
				return
			default:
			}
		}
	}()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			ledger := map[uint32]int{}
			ledgers[w] = ledger
			next := uint32(w) << 24
			adapters := []uint64{0, 0, 5}
			for i := 0; i < iters; i++ {
				doc := docs[r.IntN(len(docs))]
				p := append([]uint32(nil), doc[:r.IntN(len(doc))]...)
				a := adapters[r.IntN(len(adapters))]
				switch r.IntN(6) {
				case 0, 1: // a sequence: lookup, insert the prompt plus output, release
					m := tr.Lookup(p, bs, uint64(w), a)
					p = append(p, uint32(100+r.IntN(4)), uint32(100+r.IntN(4)))
					bt := append([]uint32(nil), m.MatchedBlocks...)
					for len(bt) < (len(p)+bs-1)/bs {
						bt = append(bt, next)
						next++
					}
					acq := tr.Insert(p, bt, nil, bs, m.MatchedTokens, a)
					for _, b := range acq.Blocks {
						ledger[b]++
					}
					for _, b := range acq.ReleasedBlocks {
						ledger[b]--
					}
					tr.Release(p, bs, a)
				case 2: // a rolled-back lookup
					m := tr.Lookup(p, bs, 0, a)
					tr.ReleaseMatched(p, bs, m.MatchedTokens, a)
				case 3: // a pin
					n := tr.PinPrefix(p, bs, a)
					tr.PeekMatchedTokens(p, bs, a)
					tr.ReleaseMatched(p, bs, n, a)
				case 4:
					for _, b := range tr.Evict(1 + r.IntN(8)).Physical {
						ledger[b]--
					}
				default:
					tr.PeekMatchedTokens(p, bs, a)
					tr.Stats()
					tr.HitStats()
				}
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	if err := <-replicaErr; err != nil {
		t.Fatal(err)
	}
	mustStructure(t, tr)
	total := map[uint32]int{}
	for _, l := range ledgers {
		for b, c := range l {
			adjust(total, b, c) // a block acquired by one worker may be evicted by another
		}
	}
	tr.mu.Lock()
	stored := map[uint32]int{}
	for i := range tr.nodes {
		n := &tr.nodes[i]
		if n.flags&(flagLive|flagRoot) != flagLive {
			continue
		}
		if n.ref != 1 {
			t.Errorf("node %d has ref %d after every sequence released", i, n.ref)
		}
		stored[n.block]++
		if n.partial != noNode {
			stored[tr.partials[n.partial].block]++
		}
	}
	tr.mu.Unlock()
	for b, c := range total {
		if stored[b] != c {
			t.Fatalf("ledger has block %d ×%d, cache stores ×%d", b, c, stored[b])
		}
	}
	if len(stored) != len(total) {
		t.Fatalf("cache stores %d distinct blocks, ledger %d", len(stored), len(total))
	}
	if err := newSummaryReplica().sync(tr); err != nil {
		t.Fatal(err)
	}
}
