// Package directory answers, for systems other than the router's own doors, "which nodes hold
// this prompt's KV cache, and on which tiers" (docs/engine-integration.md, "The KV directory"). It
// reads the router's summary index (routing.Index: every node's GPU blocks and, under their tier
// keys, the blocks its engine offloaded to CPU, disk or a shared store) and answers in the shape
// of Mooncake Conductor's indexer API, POST /query (token ids) and POST /query_by_hash (block
// hashes), so a gateway or KV connector written against that API can use a prefixmesh router as
// its KV directory (http.go). Lookup is the decision; the HTTP handler is its codec.
package directory

import (
	"errors"
	"fmt"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

// Node is one routable instance as the directory reports it: a node of the gossip view.
type Node struct {
	ID        string
	Model     string
	BlockSize int
}

// NodeLister appends the nodes the router currently routes to (alive and synced).
type NodeLister func(dst []Node) []Node

// Query is one directory question: a prompt as token ids or as its chained block hashes (one of
// the two), for a model and LoRA adapter, at a block size.
type Query struct {
	Model     string
	LoRA      string // "" for the base model
	BlockSize int
	Tokens    []uint32
	Hashes    []uint64 // prefixmesh's canonical block hashes (local.AppendBlockHashes)
	Instance  string   // "" for every node of the model, else only this one
}

// Match is one node's answer: Longest is the prompt's matched prefix in tokens across tiers (the
// GPU prefix and the lower tiers' continuation of it: what the engine serves from cache), and
// Prefix[t] the prefix tier t holds on its own, from the first block.
type Match struct {
	Node    string
	Longest int
	Prefix  routing.TierTokens
}

// MaxHashes bounds a query's block hashes, as the prompt cap bounds its tokens.
const MaxHashes = openai.MaxPromptTokens

// ErrInvalid marks a query the directory cannot answer as asked.
var ErrInvalid = errors.New("invalid directory query")

// Directory answers queries from an index and a node list. Safe for concurrent use.
type Directory struct {
	index *routing.Index
	nodes NodeLister
}

// New returns a directory over index and the nodes nodes lists.
func New(index *routing.Index, nodes NodeLister) *Directory {
	return &Directory{index: index, nodes: nodes}
}

// Scratch is a lookup's working memory; reuse one per goroutine so lookups do not allocate.
type Scratch struct {
	nodes  []Node
	ids    []string
	hashes []uint64
	blocks []int
	gpu    []int
	lower  []routing.TierTokens
	out    []Match
}

// Lookup answers q for every node of q.Model at q.BlockSize (or q.Instance alone), in the node
// list's order. The result is valid until the next Lookup with sc.
func (d *Directory) Lookup(q *Query, sc *Scratch) ([]Match, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	sc.nodes = d.nodes(sc.nodes[:0])
	sc.ids = sc.ids[:0]
	for _, n := range sc.nodes {
		if n.Model == q.Model && n.BlockSize == q.BlockSize && (q.Instance == "" || n.ID == q.Instance) {
			sc.ids = append(sc.ids, n.ID)
		}
	}
	hashes := q.Hashes
	if q.Tokens != nil {
		sc.hashes = local.AppendBlockHashes(sc.hashes[:0], q.Tokens, q.BlockSize, local.AdapterIDOf(q.LoRA))
		hashes = sc.hashes
	}
	k := len(sc.ids)
	sc.out = resize(sc.out, k)
	sc.gpu, sc.blocks, sc.lower = resize(sc.gpu, k), resize(sc.blocks, k), resize(sc.lower, k)
	d.index.Estimate(hashes, sc.ids, sc.gpu)
	d.index.ContinueLower(hashes, sc.ids, sc.gpu, q.BlockSize, sc.lower)
	for i, id := range sc.ids {
		m := &sc.out[i]
		*m = Match{Node: id, Longest: sc.gpu[i]*q.BlockSize + sc.lower[i].Lower()}
		m.Prefix[local.TierGPU] = sc.gpu[i] * q.BlockSize
	}
	// Each lower tier on its own: the same walk over the chain's tier keys.
	for t := local.TierGPU + 1; t < local.NumTiers; t++ {
		d.index.EstimateOnTier(hashes, t, sc.ids, sc.blocks)
		for i := range sc.out {
			sc.out[i].Prefix[t] = sc.blocks[i] * q.BlockSize
		}
	}
	return sc.out, nil
}

func (q *Query) check() error {
	switch {
	case q.Model == "":
		return fmt.Errorf("%w: model is required", ErrInvalid)
	case q.BlockSize <= 0 || q.BlockSize > 1<<16:
		return fmt.Errorf("%w: block_size %d must be between 1 and 65536", ErrInvalid, q.BlockSize)
	case (q.Tokens == nil) == (q.Hashes == nil):
		return fmt.Errorf("%w: give token_ids or seq_hashes, not both or neither", ErrInvalid)
	case len(q.Tokens) > openai.MaxPromptTokens:
		return fmt.Errorf("%w: %d token_ids is more than the %d a prompt may have", ErrInvalid, len(q.Tokens), openai.MaxPromptTokens)
	case len(q.Hashes) > MaxHashes:
		return fmt.Errorf("%w: %d seq_hashes is more than %d", ErrInvalid, len(q.Hashes), MaxHashes)
	}
	return nil
}

func resize[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}
