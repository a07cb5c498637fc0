package cluster

import (
	"encoding/binary"
	"fmt"

	"github.com/prefixmesh/prefixmesh/local"
)

const stateVersion = 1

// Load is a node's reported load; At (unix ns, the node's clock) lets readers judge its age.
type Load struct {
	Running             uint32 // sequences being decoded or prefilled
	Waiting             uint32 // sequences queued for admission
	FreeBlocks          uint64 // free KV blocks
	QueuedPrefillTokens uint64 // prompt tokens admitted or queued but not yet prefilled
	At                  int64
}

// sameAs reports whether two loads agree apart from their timestamps.
func (l Load) sameAs(o Load) bool {
	l.At, o.At = 0, 0
	return l == o
}

// State is a node's periodic report to the routers: its load, and the head of its published
// summary (sequence and checksum of the hash set at that sequence) so that a router that missed
// the last delta of a quiet node, or diverged silently, notices and repairs.
type State struct {
	NodeID   string
	Epoch    uint64
	HeadSeq  uint64 // last sequence the node has sent deltas up to
	Checksum uint64 // SetChecksum of the summary at HeadSeq
	Load     Load
}

// stateBytes is a state message's size without its node id: type, version, uvarint length (≤ 2),
// epoch, head, checksum, and the load's 4+4+8+8+8.
const stateBytes = 1 + 1 + 2 + 8 + 8 + 8 + 4 + 4 + 8 + 8 + 8

// AppendBinary appends s's encoding (fixed-width little-endian fields after type, version and
// node id); the result is at most stateBytes+MaxNodeIDBytes, well under MaxPacketBytes.
func (s *State) AppendBinary(b []byte) ([]byte, error) {
	if len(s.NodeID) == 0 || len(s.NodeID) > MaxNodeIDBytes {
		return nil, fmt.Errorf("encode state: %w: node id of %d bytes", ErrInvalid, len(s.NodeID))
	}
	b = append(b, msgState, stateVersion)
	b = appendStr(b, s.NodeID)
	b = binary.LittleEndian.AppendUint64(b, s.Epoch)
	b = binary.LittleEndian.AppendUint64(b, s.HeadSeq)
	b = binary.LittleEndian.AppendUint64(b, s.Checksum)
	b = binary.LittleEndian.AppendUint32(b, s.Load.Running)
	b = binary.LittleEndian.AppendUint32(b, s.Load.Waiting)
	b = binary.LittleEndian.AppendUint64(b, s.Load.FreeBlocks)
	b = binary.LittleEndian.AppendUint64(b, s.Load.QueuedPrefillTokens)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.Load.At))
	return b, nil
}

// UnmarshalBinary decodes a state message; trailing bytes are rejected.
func (s *State) UnmarshalBinary(b []byte) error {
	if len(b) > MaxPacketBytes {
		return fmt.Errorf("decode state: %w: %d bytes", ErrTooLarge, len(b))
	}
	r := reader{b: b}
	typ, ver := r.byte(), r.byte()
	if r.err == nil && typ != msgState {
		return fmt.Errorf("decode state: %w: type %d", ErrInvalid, typ)
	}
	if r.err == nil && ver != stateVersion {
		return fmt.Errorf("decode state: %w: version %d", ErrVersion, ver)
	}
	var out State
	out.NodeID = r.str(MaxNodeIDBytes)
	out.Epoch, out.HeadSeq, out.Checksum = r.u64(), r.u64(), r.u64()
	out.Load.Running, out.Load.Waiting = r.u32(), r.u32()
	out.Load.FreeBlocks, out.Load.QueuedPrefillTokens = r.u64(), r.u64()
	out.Load.At = int64(r.u64())
	if r.err != nil {
		return fmt.Errorf("decode state: %w", r.err)
	}
	if len(r.b) != 0 {
		return fmt.Errorf("decode state: %w: %d trailing bytes", ErrInvalid, len(r.b))
	}
	if out.NodeID == "" {
		return fmt.Errorf("decode state: %w: empty node id", ErrInvalid)
	}
	*s = out
	return nil
}

// mix64 is local.Mix64 (SplitMix64's finaliser): block hashes are already xxhash outputs, but
// mixing again makes the sum below robust to structured inputs (for example hashes chosen by a
// test).
func mix64(x uint64) uint64 { return local.Mix64(x) }

// SetChecksum is the order-independent checksum of a hash set: the sum (mod 2^64) of mix64 of
// every member. It updates in O(1) per change: add mix64(h) when h is added, subtract it when h
// is removed; a sum rather than XOR so that a duplicated add is not cancelled by a second one.
func SetChecksum(hashes []uint64) uint64 {
	var s uint64
	for _, h := range hashes {
		s += mix64(h)
	}
	return s
}

// applyChecksum returns sum updated by the events.
func applyChecksum(sum uint64, events []Event) uint64 {
	for _, e := range events {
		if e.Added {
			sum += mix64(e.Hash)
		} else {
			sum -= mix64(e.Hash)
		}
	}
	return sum
}
