// Package local is the node-local prefix cache: a radix tree of KV-cache blocks keyed by token
// chunks, with reference counts for the sequences that hold them, LRU eviction of unheld leaves,
// partial-block suffixes, optional disk (HSS) block ids, and a separate index of SSM state
// snapshots keyed by token-prefix hash. It implements the seed's PrefixCache contract
// (method by method in CONTRACT.md in this directory) with the decisions listed there: invalid input is ignored
// rather than panicking, children are found by the canonical chained block hash (BlockHashes) and
// confirmed by comparing tokens, eviction is O(k log N) through a heap of evictable leaves, and
// every tunable is an Options field. The tree also keeps a summary of itself, the set of chained
// block hashes visible to a walk plus a bounded, sequence-numbered journal of changes, which the
// node agent gossips to routers (SummarySince, SummarySnapshot). The package does no IO, starts
// no goroutines and reads no clock. DESIGN.md in this directory explains the data structures.
package local
