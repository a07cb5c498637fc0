package kvevents

// Kind is an event's type, from its msgspec tag ("type").
type Kind uint8

// The event kinds vLLM and SGLang publish (docs/engine-integration.md, "Wire format").
const (
	KindUnknown Kind = iota // a tag this decoder does not know: skipped and counted
	KindStored              // "BlockStored"
	KindRemoved             // "BlockRemoved"
	KindCleared             // "AllBlocksCleared"
)

func (k Kind) String() string {
	switch k {
	case KindStored:
		return "BlockStored"
	case KindRemoved:
		return "BlockRemoved"
	case KindCleared:
		return "AllBlocksCleared"
	default:
		return "unknown"
	}
}

// Tier is a normalised storage medium. Only TierGPU blocks count for PeekMatchedTokens (the
// engine's prefix cache); the others are tracked per block, answered by PeekMatchedTokensByTier
// and published in the summary under their tier keys (local.TierKey), except TierOther.
type Tier uint8

// Tiers, from the event's "medium" (case-insensitive; nil means GPU, vLLM's and SGLang's default)
// and its "locality". The spellings are the engines': vLLM's GPU/CPU/Disk LoadStoreSpec.medium()
// in vllm/v1/kv_offload/mediums.py, its MEDIUM_GPU/MEDIUM_CPU/MEDIUM_STORAGE constants and the
// LOCAL/REMOTE locality in vllm/distributed/kv_events.py; SGLang HiCache's CPU_PINNED and
// CPU_TIER1/CPU_TIER2.
const (
	TierGPU     Tier = iota // "GPU", or no medium; never REMOTE
	TierCPU                 // "CPU", SGLang's "CPU_TIER1", "CPU_TIER2", "CPU_PINNED"
	TierDisk                // "Disk" (vLLM's DiskLoadStoreSpec), "DISK"
	TierStorage             // "STORAGE", locality LOCAL or unspecified: the node's own storage tier
	TierRemote              // any medium with locality REMOTE: held by a store off this node
	TierOther               // anything else ("EXTERNAL", connector tiers): tracked, never credited
	numTiers
)

var tierNames = [numTiers]string{"gpu", "cpu", "disk", "storage", "remote", "other"}

func (t Tier) String() string {
	if t < numTiers {
		return tierNames[t]
	}
	return "other"
}

// Locality is an event's "locality" (vLLM's tiered offloading: where the copy lives relative to
// the publisher).
type Locality uint8

// Localities. Only REMOTE changes the tier (to TierRemote); an unspecified one, or a value vLLM
// does not define (skipped and counted as an unknown field), leaves the medium's tier as it is.
const (
	LocalityUnset  Locality = iota // absent, nil, or not a value vLLM defines
	LocalityLocal                  // "LOCAL"
	LocalityRemote                 // "REMOTE"
)

// Extra-key classes, one per stored block (Event.Extra).
const (
	extraNone  uint8 = iota // nil: the block's hash depends on its tokens and parent only
	extraLoRA               // a one-string tuple: the LoRA name (vLLM puts lora_name first)
	extraOther              // anything else: multimodal ids, cache_salt, prompt embeddings
)

// Event is one decoded KV-cache event. Slices are owned by the Decoder and valid until its next
// Decode.
type Event struct {
	Kind Kind
	// Hashes are the engine's block hashes as opaque 64-bit keys: unsigned ints as they are,
	// signed ints by two's complement (SGLang, pre-#23673 vLLM), bytes by their last 8 bytes
	// (the value vLLM's int mode would have sent).
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	Tokens    []uint32
	BlockSize int
	// Tier is the medium, with the locality applied (Decoder: REMOTE makes any medium TierRemote).
	Tier     Tier
	Locality Locality
	// LoRAName is the adapter's name ("" for the base model); LoRAID the deprecated integer id.
	LoRAName  string
	LoRAID    int64
	HasLoRAID bool
	// Extra classifies each block's extra keys (parallel to Hashes when present, else empty).
	Extra []uint8
	// extraStr is the xxhash of a block's one-string extra key, to compare with LoRAName.
	extraStr []uint64
	// Salted: SGLang's cache_salt (a metadata map at position 7, or the map field) is set.
	Salted bool
	// Group is the KV-cache group (hybrid models); 0 without one.
	Group int
	// Spec is the group's kind from kv_cache_spec_kind (SpecUnset when absent), Window its
	// kv_cache_spec_sliding_window in tokens (0 when absent).
	Spec   SpecKind
	Window int
	// bad: a field had the wrong type or range; the event is skipped and counted.
	bad bool
	// container: the event is an array or a map; untagged: it has no readable tag ("type").
	container, untagged bool
}

// SpecKind is a KV-cache group's attention type, from vLLM's kv_cache_spec_kind.
type SpecKind uint8

// Spec kinds. vLLM names them after its KVCacheSpec classes (vllm/v1/kv_cache_interface.py).
const (
	SpecUnset   SpecKind = iota // no kv_cache_spec_kind (older vLLM, SGLang)
	SpecFull                    // "full_attention"
	SpecSliding                 // "sliding_window" (and chunked local attention)
	SpecMamba                   // "mamba"
	SpecOther                   // any other name
)

func specOf(s string) SpecKind {
	switch s {
	case "full_attention":
		return SpecFull
	case "sliding_window", "chunked_local_attention":
		return SpecSliding
	case "mamba":
		return SpecMamba
	}
	return SpecOther
}

// Batch is one decoded message: its sequence number and its events.
type Batch struct {
	Seq     uint64
	TS      float64
	Rank    int  // data_parallel_rank (vLLM) or attn_dp_rank (SGLang)
	HasRank bool // the batch carried a rank
	Events  []Event
	// Unknown counts events with an unknown tag; Malformed those with a field of the wrong type
	// or range; Fields the unknown map keys and trailing positional fields skipped.
	Unknown, Malformed, Fields int
	// UnknownRemoving counts the unknown events (of Unknown) that may have removed blocks: those
	// that name blocks (a "block_hashes" field, or a list at position 1 where both engines keep
	// an event's hashes), since a new kind could move or evict the blocks it names, and those
	// with no readable tag, of which nothing is known. An unknown event that names no blocks
	// cannot take one away: the engines remove blocks by naming them (BlockRemoved) or all at
	// once (AllBlocksCleared).
	UnknownRemoving int
}
