package node

import (
	"errors"
	"fmt"
	"math"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// Limits on what one request may carry. They are checked at the edge, before the cache, so that a
// malformed or hostile request costs the node a status message and never a panic, a huge
// allocation or a long walk under the tree lock: the gRPC layer rejects with InvalidArgument
// what the cache would refuse or choke on, before it reaches the cache.
const (
	// MaxBlockSize is the largest block size accepted. Paged-attention engines use 16 to 256 tokens
	// per block (vLLM, SGLang, TensorRT-LLM); 4096 leaves an order of magnitude of headroom while
	// bounding the per-block work (one hash and one token comparison over the whole chunk) that a
	// single child step costs under the tree lock.
	MaxBlockSize = 4096

	// MaxTokens is the longest token list accepted in one request. One million tokens covers the
	// longest context windows served today, and bounds a request to 4 MiB of token ids in memory
	// and the tree work of one call to 2^20/block_size child steps.
	MaxTokens = 1 << 20

	// MaxEvictBlocks is the largest num_blocks one Evict call may ask for. The biggest KV pools
	// hold around 10^6 blocks (8 × 80 GB at ~0.5 MB per 16-token block), and the response lists
	// every evicted block, so a bigger request is a bug; callers that need more loop.
	MaxEvictBlocks = 1 << 20

	// MaxSlot is the largest snapshot slot accepted. Slots index the engine's snapshot pool, which
	// holds thousands of entries; the int32 range is far above any pool and keeps a slot a valid
	// Go int on every platform.
	MaxSlot = math.MaxInt32

	// MaxMsgSize is the gRPC message size limit, in both directions, derived from MaxTokens: the
	// largest valid request is an insert whose tokens, block_table and disk_block_ids are each
	// MaxTokens entries of up to 5 bytes (a packed varint uint32), plus 64 KiB for framing and
	// the scalar fields. The largest response (a Lookup of MaxTokens one-token blocks with disk
	// ids, or an Evict of MaxEvictBlocks) is smaller. Clients that send or receive prompts near
	// MaxTokens must raise their own limits (grpc.MaxCallRecvMsgSize) to this value.
	MaxMsgSize = 3*5*MaxTokens + 64<<10
)

// ErrInvalidArgument is the sentinel every validation error wraps; the server maps it to
// codes.InvalidArgument.
var ErrInvalidArgument = errors.New("invalid argument")

// FieldError is a rejected request field: its proto name, the offending value and why.
type FieldError struct {
	Field  string // proto field name, e.g. "block_size"
	Value  any    // the offending value (a length for lists)
	Reason string // what the value should have been
}

// Error reads like "block_size = 0: must be in [1, 4096]".
func (e *FieldError) Error() string {
	return fmt.Sprintf("%s = %v: %s", e.Field, e.Value, e.Reason)
}

// Unwrap makes every FieldError an ErrInvalidArgument.
func (e *FieldError) Unwrap() error { return ErrInvalidArgument }

func fieldErr(field string, value any, format string, args ...any) error {
	return &FieldError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
}

func checkBlockSize(bs int32) error {
	if bs <= 0 || bs > MaxBlockSize {
		return fieldErr("block_size", bs, "must be in [1, %d]", MaxBlockSize)
	}
	return nil
}

func checkTokens(tokens []uint32) error {
	if len(tokens) > MaxTokens {
		return fieldErr("tokens", fmt.Sprintf("<%d tokens>", len(tokens)), "at most %d tokens (MaxTokens)", MaxTokens)
	}
	return nil
}

func checkTokensBS(tokens []uint32, bs int32) error {
	if err := checkTokens(tokens); err != nil {
		return err
	}
	return checkBlockSize(bs)
}

func checkMatched(field string, matched int64, tokens []uint32) error {
	if matched < 0 || matched > int64(len(tokens)) {
		return fieldErr(field, matched, "must be in [0, len(tokens) = %d]", len(tokens))
	}
	return nil
}

func checkSlot(field string, slot int64) error {
	if slot < 0 || slot > MaxSlot {
		return fieldErr(field, slot, "must be in [0, %d]", MaxSlot)
	}
	return nil
}

// checkInsert validates the shared shape of the insert family (local/CONTRACT.md, "Insert"): a
// block table no longer than the tokens' blocks (full ones plus one partial), no NoBlock entry in
// it, disk ids empty or parallel, and matched_tokens inside the tokens.
func checkInsert(tokens, blockTable, diskBlockIDs []uint32, bs int32, matched int64) error {
	if err := checkTokensBS(tokens, bs); err != nil {
		return err
	}
	maxBlocks := (len(tokens) + int(bs) - 1) / int(bs)
	if len(blockTable) > maxBlocks {
		return fieldErr("block_table", fmt.Sprintf("<%d entries>", len(blockTable)),
			"at most ceil(len(tokens)/block_size) = %d entries", maxBlocks)
	}
	for i, b := range blockTable {
		if b == local.NoBlock {
			return fieldErr(fmt.Sprintf("block_table[%d]", i), b, "0xFFFFFFFF (no block) is not a KV block")
		}
	}
	if len(diskBlockIDs) != 0 && len(diskBlockIDs) != len(blockTable) {
		return fieldErr("disk_block_ids", fmt.Sprintf("<%d entries>", len(diskBlockIDs)),
			"must be empty or as long as block_table (%d entries)", len(blockTable))
	}
	return checkMatched("matched_tokens", matched, tokens)
}

// Validate checks a NodeCache request against the limits above and the contract of the method it
// is for. It returns nil or a *FieldError (wrapping ErrInvalidArgument) naming the first bad
// field. Requests of a type it does not know are accepted.
func Validate(req any) error {
	switch r := req.(type) {
	case *pb.LookupRequest:
		return checkTokensBS(r.GetTokens(), r.GetBlockSize())
	case *pb.PeekMatchedTokensRequest:
		return checkTokensBS(r.GetTokens(), r.GetBlockSize())
	case *pb.PinPrefixRequest:
		return checkTokensBS(r.GetTokens(), r.GetBlockSize())
	case *pb.InsertRequest:
		return checkInsert(r.GetTokens(), r.GetBlockTable(), r.GetDiskBlockIds(), r.GetBlockSize(), r.GetMatchedTokens())
	case *pb.InsertWithSnapshotRequest:
		if err := checkInsert(r.GetTokens(), r.GetBlockTable(), r.GetDiskBlockIds(), r.GetBlockSize(), r.GetMatchedTokens()); err != nil {
			return err
		}
		return checkSlot("snapshot_id", r.GetSnapshotId())
	case *pb.InsertIntermediateSnapshotRequest:
		// The tree fields are ignored (local/CONTRACT.md, "Snapshot inserts"), so they may be left unset; when any is set,
		// the whole shape must be valid, so a caller's bug still surfaces.
		if len(r.GetBlockTable()) == 0 && len(r.GetDiskBlockIds()) == 0 && r.GetBlockSize() == 0 && r.GetMatchedTokens() == 0 {
			if err := checkTokens(r.GetTokens()); err != nil {
				return err
			}
		} else if err := checkInsert(r.GetTokens(), r.GetBlockTable(), r.GetDiskBlockIds(), r.GetBlockSize(), r.GetMatchedTokens()); err != nil {
			return err
		}
		return checkSlot("snapshot_id", r.GetSnapshotId())
	case *pb.InsertTailSnapshotRequest:
		if err := checkTokens(r.GetTokens()); err != nil {
			return err
		}
		return checkSlot("snapshot_id", r.GetSnapshotId())
	case *pb.InsertTailSiblingSnapshotRequest:
		if err := checkTokens(r.GetTokens()); err != nil {
			return err
		}
		return checkSlot("snapshot_id", r.GetSnapshotId())
	case *pb.ReleaseRequest:
		return checkTokensBS(r.GetTokens(), r.GetBlockSize())
	case *pb.ReleaseMatchedRequest:
		if err := checkTokensBS(r.GetTokens(), r.GetBlockSize()); err != nil {
			return err
		}
		return checkMatched("matched_tokens", r.GetMatchedTokens(), r.GetTokens())
	case *pb.EvictRequest:
		if n := r.GetNumBlocks(); n < 0 || n > MaxEvictBlocks {
			return fieldErr("num_blocks", n, "must be in [0, %d] (MaxEvictBlocks)", MaxEvictBlocks)
		}
	case *pb.EvictSnapshotSlotRequest:
		return checkSlot("slot", r.GetSlot())
	case *pb.EvictSnapshotToTierRequest:
		if n := r.GetMinTokens(); n < 0 || n > MaxTokens {
			return fieldErr("min_tokens", n, "must be in [0, %d] (MaxTokens)", MaxTokens)
		}
	case *pb.PromoteSnapshotRequest:
		return checkSlot("new_slot", r.GetNewSlot())
	}
	return nil
}
