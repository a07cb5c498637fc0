package requests

import (
	"fmt"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// BenchmarkPickDecision is the whole routing decision of the front door (candidates, hashing,
// index and overlay estimates, policy, in-flight and overlay bookkeeping, FirstToken and Done)
// for a prompt over 64 nodes, each holding a different-length prefix of it, against hashing the
// same tokens (the floor) in the same run. "overlay" first routes 300 requests sharing the
// prompt's first half with their own second halves through the picker, each reaching its first
// token, so the overlay holds ~300 recent chains on the nodes they went to, as under load.
//
// "paired" times hashing and the overlay decision alternately, one of each per iteration, and
// reports their ratio (decision/hash): on a shared machine whose speed drifts between runs and
// even between sub-benchmarks, only timings taken microseconds apart compare.
func BenchmarkPickDecision(b *testing.B) {
	for _, tokens := range []int{8192, 65536} {
		const nodes, bs = 64, 16
		toks := make([]uint32, tokens)
		for i := range toks {
			toks[i] = uint32(i*7919) % 100000
		}
		hashes := local.BlockHashes(toks, bs, 0)
		b.Run(fmt.Sprintf("%dk/hash-only", tokens/1024), func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]uint64, 0, len(hashes))
			for b.Loop() {
				dst = local.AppendBlockHashes(dst[:0], toks, bs, 0)
			}
		})
		for _, withOverlay := range []bool{false, true} {
			p, _ := stairPicker(b, nodes, tokens)
			name := "empty-overlay"
			if withOverlay {
				name = "overlay"
				fillOverlay(b, p, toks)
			}
			req := &PickRequest{Tokens: toks, Model: simModel}
			b.Run(fmt.Sprintf("%dk/%s", tokens/1024, name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					decideOnce(b, p, req)
				}
			})
			if !withOverlay {
				continue
			}
			b.Run(fmt.Sprintf("%dk/paired", tokens/1024), func(b *testing.B) {
				dst := make([]uint64, 0, len(hashes))
				var hashing, deciding time.Duration
				for b.Loop() {
					t0 := time.Now()
					dst = local.AppendBlockHashes(dst[:0], toks, bs, 0)
					t1 := time.Now()
					decideOnce(b, p, req)
					hashing, deciding = hashing+t1.Sub(t0), deciding+time.Since(t1)
				}
				b.ReportMetric(float64(hashing.Nanoseconds())/float64(b.N), "hash-ns/op")
				b.ReportMetric(float64(deciding.Nanoseconds())/float64(b.N), "decision-ns/op")
				b.ReportMetric(float64(deciding)/float64(hashing), "decision/hash")
			})
		}
	}
}

// fillOverlay routes 300 requests through p that share toks's first half and have their own
// second halves, each reaching its first token: ~300 recent chains in the overlay.
func fillOverlay(b *testing.B, p *PolicyPicker, toks []uint32) {
	tokens := len(toks)
	for r := range 300 {
		other := append([]uint32(nil), toks[:tokens/2]...)
		for j := tokens / 2; j < tokens; j++ {
			other = append(other, uint32(1_000_000+r*tokens+j))
		}
		decideOnce(b, p, &PickRequest{Tokens: other, Model: simModel})
	}
}

// decideOnce is one whole decision: Pick, its first token, Done.
func decideOnce(b *testing.B, p *PolicyPicker, req *PickRequest) {
	pk, err := p.Pick(b.Context(), req, nil)
	if err != nil {
		b.Fatal(err)
	}
	pk.FirstToken()
	pk.Done(Outcome{Status: 200})
}

// BenchmarkPick8kTokens64Nodes is one routing decision (hashing, index and overlay estimates,
// policy, in-flight bookkeeping, Done) for an 8k-token prompt over 64 nodes, each holding a
// different-length prefix of it; "hash-only" is the floor, hashing the same tokens.
func BenchmarkPick8kTokens64Nodes(b *testing.B) {
	p, toks := stairPicker(b, 64, 8192)
	req := &PickRequest{Tokens: toks, Model: simModel}
	b.Run("pick", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pk, err := p.Pick(b.Context(), req, nil)
			if err != nil {
				b.Fatal(err)
			}
			pk.Done(Outcome{})
		}
	})
	b.Run("hash-only", func(b *testing.B) {
		b.ReportAllocs()
		dst := make([]uint64, 0, len(toks)/16)
		for b.Loop() {
			dst = local.AppendBlockHashes(dst[:0], toks, 16, 0)
		}
	})
}
