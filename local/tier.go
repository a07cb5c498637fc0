package local

// Tiers in the summary. A node's summary is a set of 64-bit keys: the canonical hash of every
// block its GPU cache would match (the tree's own journal, and a mirror's GPU copies), plus, for a
// node whose engine offloads KV, one key per block held on a lower tier: TierKey(hash, tier). A
// lower-tier key is the block's hash XOR a fixed constant of the tier, so the gossip wire, the
// journal, snapshots, checksums and the router's index carry tiers without knowing of them (a
// router that does not look for tier keys only stores them), and a router finds a block's tiers
// by looking its hash up once per tier. A tier key equals some other block's canonical hash with
// probability 2⁻⁶⁴ per pair, the same odds as two blocks' hashes colliding.

// Tier is where a node holds a copy of a block's KV.
type Tier uint8

// The summary's tiers, fastest first. The names are the engines' media (node/kvevents maps
// every spelling onto these); TierRemote is any medium whose locality says it is held off the
// node (a shared pool).
const (
	TierGPU     Tier = iota // the engine's GPU cache: what PeekMatchedTokens matches
	TierCPU                 // host memory (vLLM's offloading connector "CPU", SGLang HiCache's host tier)
	TierDisk                // the node's disk ("Disk", "DISK")
	TierStorage             // vLLM's tiered "STORAGE" medium with local locality
	TierRemote              // a store off the node (locality REMOTE, a shared pool)
	NumTiers
)

var tierNames = [NumTiers]string{"gpu", "cpu", "disk", "storage", "remote"}

// String is the tier's lower-case name (metrics labels, headers).
func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return "unknown"
}

// tierSalt is XORed into a block hash to make its key on each tier: well-mixed 64-bit constants
// (the fractional bits of √2, √3, √5 and √7, as SHA-512's initial values), fixed forever since nodes and routers of
// different releases share them on the wire.
var tierSalt = [NumTiers]uint64{
	0,
	0x6a09e667f3bcc908,
	0xbb67ae8584caa73b,
	0x3c6ef372fe94f82b,
	0xa54ff53a5f1d36f1,
}

// TierKey is the summary key of a copy of the block with canonical hash h on tier t: h itself for
// the GPU. It panics if t is not a tier.
func TierKey(h uint64, t Tier) uint64 { return h ^ tierSalt[t] }
