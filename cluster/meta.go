package cluster

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Role says what a member does in the fleet.
type Role uint8

const (
	// RoleNode is a GPU node's cache agent: it owns a tree and publishes its summary.
	RoleNode Role = 1
	// RoleRouter mirrors every node's summary and routes requests.
	RoleRouter Role = 2
)

func (r Role) String() string {
	switch r {
	case RoleNode:
		return "node"
	case RoleRouter:
		return "router"
	default:
		return fmt.Sprintf("role(%d)", uint8(r))
	}
}

// metaVersion is the first byte of encoded metadata. Fields appended at the end by a later
// revision keep the version (decoders ignore trailing bytes, so a rolling upgrade can add
// fields); a change that reinterprets an existing field takes a new version.
const metaVersion = 1

// MaxMetaBytes is memberlist's limit on node metadata (memberlist.MetaMaxSize): metadata rides in
// every alive message, which must fit one UDP packet with the rest of the gossip.
const MaxMetaBytes = 512

// maxMetaString bounds each string field so that all five together stay under MaxMetaBytes
// with the fixed fields, and a hostile length prefix cannot ask for a large allocation.
const maxMetaString = 255

// Flag bits of Meta's flags byte. A decoder ignores bits it does not know, so a flag added by a
// later release is invisible to an older router during a rolling upgrade (it keeps routing as
// before) and needs no new version.
const (
	metaFlagDraining = 1 << 0
	metaFlagCold     = 1 << 1 // the node's mirror of its engine's cache is incomplete
)

// Meta is a member's metadata, carried by memberlist in its alive messages.
type Meta struct {
	Role       Role
	NodeID     string
	Epoch      uint64 // random at process start, new when a mirrored engine restarts (Agent.SetEpoch): a new epoch means an empty cache
	GRPCAddr   string // NodeCache (nodes) or Router (routers) gRPC address
	EngineURL  string // OpenAI-compatible engine base URL (nodes)
	RaftAddr   string // Raft address when the member is a pin-store voter
	Model      string
	BlockSize  uint32 // tokens per KV block
	KVCapacity uint64 // KV capacity in blocks
	Draining   bool
	// Cold: the node's view of its cache is incomplete (a mirrored engine's KV events were lost
	// beyond replay, or the mirror has no clean baseline yet), so its summary is a lower bound.
	// Routers still send it load but take no prefix affinity from it until it clears.
	Cold bool
}

// MarshalBinary encodes m: version, role, flags, epoch (8 bytes LE), block size and capacity
// (uvarints), then node id, gRPC address, engine URL, Raft address and model as uvarint-length
// strings. It fails when a field is out of range or the result exceeds MaxMetaBytes.
func (m Meta) MarshalBinary() ([]byte, error) {
	return m.appendBinary(make([]byte, 0, 128))
}

func (m Meta) appendBinary(b []byte) ([]byte, error) {
	if m.Role != RoleNode && m.Role != RoleRouter {
		return nil, fmt.Errorf("encode meta: %w: role %d", ErrInvalid, m.Role)
	}
	if m.NodeID == "" {
		return nil, fmt.Errorf("encode meta: %w: empty node id", ErrInvalid)
	}
	var flags byte
	if m.Draining {
		flags |= metaFlagDraining
	}
	if m.Cold {
		flags |= metaFlagCold
	}
	b = append(b, metaVersion, byte(m.Role), flags)
	b = binary.LittleEndian.AppendUint64(b, m.Epoch)
	b = binary.AppendUvarint(b, uint64(m.BlockSize))
	b = binary.AppendUvarint(b, m.KVCapacity)
	for _, s := range [...]string{m.NodeID, m.GRPCAddr, m.EngineURL, m.RaftAddr, m.Model} {
		if len(s) > maxMetaString {
			return nil, fmt.Errorf("encode meta: %w: field of %d bytes (max %d)", ErrInvalid, len(s), maxMetaString)
		}
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	if len(b) > MaxMetaBytes {
		return nil, fmt.Errorf("encode meta: %w: %d bytes (max %d)", ErrTooLarge, len(b), MaxMetaBytes)
	}
	return b, nil
}

// UnmarshalBinary decodes metadata written by MarshalBinary. Trailing bytes are ignored (see
// metaVersion).
func (m *Meta) UnmarshalBinary(b []byte) error {
	if len(b) > MaxMetaBytes {
		return fmt.Errorf("decode meta: %w: %d bytes", ErrTooLarge, len(b))
	}
	r := reader{b: b}
	if v := r.byte(); v != metaVersion {
		if r.err != nil {
			return fmt.Errorf("decode meta: %w", r.err)
		}
		return fmt.Errorf("decode meta: %w: version %d", ErrVersion, v)
	}
	var out Meta
	out.Role = Role(r.byte())
	flags := r.byte()
	out.Draining = flags&metaFlagDraining != 0
	out.Cold = flags&metaFlagCold != 0 // other bits: a later release's flags, ignored
	out.Epoch = r.u64()
	bs := r.uvarint()
	if bs > math.MaxUint32 {
		return fmt.Errorf("decode meta: %w: block size %d", ErrInvalid, bs)
	}
	out.BlockSize = uint32(bs)
	out.KVCapacity = r.uvarint()
	out.NodeID = r.str(maxMetaString)
	out.GRPCAddr = r.str(maxMetaString)
	out.EngineURL = r.str(maxMetaString)
	out.RaftAddr = r.str(maxMetaString)
	out.Model = r.str(maxMetaString)
	if r.err != nil {
		return fmt.Errorf("decode meta: %w", r.err)
	}
	if out.Role != RoleNode && out.Role != RoleRouter {
		return fmt.Errorf("decode meta: %w: role %d", ErrInvalid, out.Role)
	}
	if out.NodeID == "" {
		return fmt.Errorf("decode meta: %w: empty node id", ErrInvalid)
	}
	*m = out
	return nil
}
