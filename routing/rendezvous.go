package routing

import "github.com/prefixmesh/prefixmesh/local"

// Rendezvous (highest-random-weight) hashing, Thaler and Ravishankar, "Using name-based mappings to
// increase hit rates", IEEE/ACM ToN 1998: for a key, every node gets a pseudo-random weight
// w(key, node) and the node with the highest weight wins. Removing a node only moves the keys it
// won; every replica computing the same function over the same node ids agrees without
// coordination. The weight is a pure function of its inputs (no seed, no process state), so two
// router processes — or two Policy instances — always agree.

// nodeIDHash is 64-bit FNV-1a of a node id, inlined to avoid the allocation of hash/fnv's
// interface value.
func nodeIDHash(id string) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= prime64
	}
	return h
}

// mix64 is local.Mix64, the SplitMix64 finaliser: a bijection with full avalanche, so nearby
// keys get unrelated weights.
func mix64(x uint64) uint64 { return local.Mix64(x) }

// RendezvousWeight is the weight of node id for key; the highest weight wins.
func RendezvousWeight(key uint64, id string) uint64 {
	return mix64(key ^ mix64(nodeIDHash(id)))
}

// RendezvousPick returns the index of the node with the highest weight for key among ids, or -1 if
// ids is empty. Equal weights (equal ids) resolve to the lower index.
func RendezvousPick(key uint64, ids []string) int {
	best, bestW := -1, uint64(0)
	for i, id := range ids {
		if w := RendezvousWeight(key, id); best < 0 || w > bestW {
			best, bestW = i, w
		}
	}
	return best
}

// requestKey is the key a request's ties are broken by: its first block hash (so requests sharing
// a first block agree on a node), else its session key, else the prompt length.
func requestKey(req *Request) uint64 {
	if len(req.Hashes) > 0 {
		return req.Hashes[0]
	}
	if req.SessionKey != 0 {
		return req.SessionKey
	}
	return uint64(req.PromptTokens)
}
