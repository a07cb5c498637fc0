package sim

import (
	"fmt"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/local/kvpool"
)

// References computes what no routing can beat by placement alone: the token hit ratio of one
// pooled LRU cache of Nodes × BlocksPerNode blocks with no load limit (a single RadixTree and
// kvpool fed the trace one request at a time: admit, insert, finish; with a CPU tier, one tier
// of Nodes × CPUBlocks blocks behind it, its loads counted as hits as the nodes count them), and
// of an infinite cache (every full block ever seen stays cached).
func References(trace *Trace, cfg Config) (Reference, error) {
	if err := cfg.Validate(); err != nil {
		return Reference{}, err
	}
	bs := cfg.BlockSize
	tree := local.NewRadixTree(local.Options{})
	var (
		cache local.PrefixCache = tree
		cpu   *kvpool.CPUTier
		err   error
	)
	if cfg.CPUBlocks > 0 {
		if cpu, err = kvpool.NewCPUTier(cfg.Nodes*cfg.CPUBlocks, cfg.CPUChunkBlocks, bs); err != nil {
			return Reference{}, fmt.Errorf("pooled reference: %w", err)
		}
		if cache, err = kvpool.NewSpillCache(tree, cpu, cfg.Nodes*cfg.BlocksPerNode, bs); err != nil {
			return Reference{}, fmt.Errorf("pooled reference: %w", err)
		}
	}
	pool, err := kvpool.New(cache, cfg.Nodes*cfg.BlocksPerNode, bs)
	if err != nil {
		return Reference{}, fmt.Errorf("pooled reference: %w", err)
	}
	seen := make(map[uint64]struct{})
	var prompt, pooled, infinite int64
	var hashes []uint64
	for i := range trace.Requests {
		req := &trace.Requests[i]
		seq, err := pool.Admit(req.Tokens, 0, req.OutputTokens)
		if err != nil {
			continue // larger than the pooled cache (ErrTooLarge); nothing else runs
		}
		prompt += int64(len(req.Tokens))
		pooled += int64(seq.MatchedTokens())
		if cpu != nil {
			pooled += int64(cpu.Load(req.Tokens, 0, seq.MatchedTokens()))
		}
		_ = seq.Insert()
		_ = seq.Finish()

		hashes = local.AppendBlockHashes(hashes[:0], req.Tokens, bs, 0)
		held := 0
		for held < len(hashes) {
			if _, ok := seen[hashes[held]]; !ok {
				break
			}
			held++
		}
		infinite += int64(held * bs)
		for _, h := range hashes[held:] {
			seen[h] = struct{}{}
		}
	}
	var ref Reference
	if prompt > 0 {
		ref.PooledLRUHitRatio = float64(pooled) / float64(prompt)
		ref.InfiniteHitRatio = float64(infinite) / float64(prompt)
	}
	return ref, nil
}
