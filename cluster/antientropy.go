package cluster

import (
	"encoding/binary"
	"fmt"
)

// Push/pull anti-entropy. memberlist periodically exchanges LocalState between random pairs of
// members over TCP. Ours is a version vector: for each node the sender knows, (epoch, sequence,
// checksum of the summary at that sequence). A node sends its own entry (the truth); a router
// sends its mirror. A router merging a node's entry repairs if it holds the same sequence with
// another checksum (silent divergence) and otherwise treats a later sequence as news it must
// reach soon; merging another router's vector only raises the sequence it expects. The state
// packets of state.go carry the same triple every second; push/pull is the backstop that needs
// no extra code path on the node.

const pushVersion = 1

// MaxVectorEntries bounds a decoded vector: a fleet larger than 16k nodes is far beyond one
// memberlist pool, and the cap keeps a hostile count from allocating without bound.
const MaxVectorEntries = 1 << 14

// VersionEntry is one node's summary version.
type VersionEntry struct {
	NodeID   string
	Epoch    uint64
	Seq      uint64
	Checksum uint64
}

// Vector is a push/pull state: who sent it and the versions it knows.
type Vector struct {
	Role    Role
	From    string
	Entries []VersionEntry
}

// AppendBinary appends v: type, version, role, sender id, uvarint count, then per entry the
// node id and three 8-byte little-endian fields.
func (v *Vector) AppendBinary(b []byte) ([]byte, error) {
	if len(v.Entries) > MaxVectorEntries {
		return nil, fmt.Errorf("encode vector: %w: %d entries", ErrTooLarge, len(v.Entries))
	}
	if len(v.From) > MaxNodeIDBytes {
		return nil, fmt.Errorf("encode vector: %w: sender id of %d bytes", ErrInvalid, len(v.From))
	}
	b = append(b, msgPush, pushVersion, byte(v.Role))
	b = appendStr(b, v.From)
	b = binary.AppendUvarint(b, uint64(len(v.Entries)))
	for _, e := range v.Entries {
		if len(e.NodeID) == 0 || len(e.NodeID) > MaxNodeIDBytes {
			return nil, fmt.Errorf("encode vector: %w: node id of %d bytes", ErrInvalid, len(e.NodeID))
		}
		b = appendStr(b, e.NodeID)
		b = binary.LittleEndian.AppendUint64(b, e.Epoch)
		b = binary.LittleEndian.AppendUint64(b, e.Seq)
		b = binary.LittleEndian.AppendUint64(b, e.Checksum)
	}
	return b, nil
}

// UnmarshalBinary decodes a vector; trailing bytes are rejected.
func (v *Vector) UnmarshalBinary(b []byte) error {
	r := reader{b: b}
	typ, ver := r.byte(), r.byte()
	if r.err == nil && typ != msgPush {
		return fmt.Errorf("decode vector: %w: type %d", ErrInvalid, typ)
	}
	if r.err == nil && ver != pushVersion {
		return fmt.Errorf("decode vector: %w: version %d", ErrVersion, ver)
	}
	var out Vector
	out.Role = Role(r.byte())
	out.From = r.str(MaxNodeIDBytes)
	n := r.uvarint()
	if r.err == nil && n > MaxVectorEntries {
		return fmt.Errorf("decode vector: %w: %d entries", ErrTooLarge, n)
	}
	// Each entry takes at least 25 bytes; never allocate more than the input can hold.
	if r.err == nil && n > uint64(len(r.b)/25) {
		return fmt.Errorf("decode vector: %w: %d entries in %d bytes", ErrTruncated, n, len(r.b))
	}
	if n > 0 && r.err == nil {
		out.Entries = make([]VersionEntry, 0, n)
	}
	for i := uint64(0); i < n && r.err == nil; i++ {
		e := VersionEntry{NodeID: r.str(MaxNodeIDBytes)}
		e.Epoch, e.Seq, e.Checksum = r.u64(), r.u64(), r.u64()
		if r.err == nil && e.NodeID == "" {
			r.fail(fmt.Errorf("%w: empty node id", ErrInvalid))
		}
		out.Entries = append(out.Entries, e)
	}
	if r.err != nil {
		return fmt.Errorf("decode vector: %w", r.err)
	}
	if len(r.b) != 0 {
		return fmt.Errorf("decode vector: %w: %d trailing bytes", ErrInvalid, len(r.b))
	}
	if out.Role != RoleNode && out.Role != RoleRouter {
		return fmt.Errorf("decode vector: %w: role %d", ErrInvalid, out.Role)
	}
	*v = out
	return nil
}
