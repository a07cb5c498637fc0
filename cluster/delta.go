package cluster

import (
	"encoding/binary"
	"fmt"
)

// Message types: the first byte of every user message and push/pull state this package sends.
// The second byte is the type's format version.
const (
	msgDelta byte = 1 // summary delta, node → router (this file)
	msgState byte = 2 // load, head sequence and checksum, node → router (state.go)
	msgPush  byte = 3 // push/pull version vector, any member (antientropy.go)
)

const deltaVersion = 1

// MaxPacketBytes caps every user message so that it fits one UDP datagram after memberlist adds
// its own framing (1 type byte, an optional label of up to 2+len bytes, AES-GCM's 29 bytes and
// the 4-byte CRC) within its 1,400-byte UDPBufferSize and below a 1,500-byte Ethernet MTU.
const MaxPacketBytes = 1300

// MaxNodeIDBytes bounds a node id on the wire: long enough for a Kubernetes pod name (253), and
// it leaves 1,000+ bytes of a delta for hashes.
const MaxNodeIDBytes = 253

// deltaFixedBytes is a delta's size without node id and events: type, version, uvarint node id
// length (at most 2 bytes for ≤ 253), epoch, fromSeq, toSeq, emit time and the event count.
const deltaFixedBytes = 1 + 1 + 2 + 8 + 8 + 8 + 8 + 2

// Event is one change of a node's summary: a chained block hash became visible (Added) or
// stopped being visible.
type Event struct {
	Hash  uint64
	Added bool
}

// Delta is a run of consecutive summary changes of one node: applied to the node's state at
// FromSeq, it yields the state at ToSeq.
type Delta struct {
	NodeID   string
	Epoch    uint64
	FromSeq  uint64
	ToSeq    uint64
	EmitUnix int64 // sender's wall clock (ns) when the delta was built; for the lag metric
	Events   []Event
}

// MaxDeltaEvents is how many events fit one packet with a node id of idLen bytes: each event
// costs 8 bytes of hash plus one bit in the add/remove bitmap.
func MaxDeltaEvents(idLen int) int {
	avail := MaxPacketBytes - deltaFixedBytes - idLen
	n := avail * 8 / 65
	for n > 0 && 8*n+(n+7)/8 > avail {
		n--
	}
	return n
}

// AppendBinary appends d's encoding: type, version, node id, epoch, fromSeq, toSeq and emit time
// (8 bytes LE each), event count (2 bytes), a bitmap of Added flags (bit i of byte i/8) and the
// hashes (8 bytes LE each). It fails if the result would exceed MaxPacketBytes.
func (d *Delta) AppendBinary(b []byte) ([]byte, error) {
	if len(d.NodeID) == 0 || len(d.NodeID) > MaxNodeIDBytes {
		return nil, fmt.Errorf("encode delta: %w: node id of %d bytes", ErrInvalid, len(d.NodeID))
	}
	if d.ToSeq < d.FromSeq {
		return nil, fmt.Errorf("encode delta: %w: seq %d..%d", ErrInvalid, d.FromSeq, d.ToSeq)
	}
	if len(d.Events) > MaxDeltaEvents(len(d.NodeID)) {
		return nil, fmt.Errorf("encode delta: %w: %d events (max %d)", ErrTooLarge, len(d.Events), MaxDeltaEvents(len(d.NodeID)))
	}
	b = append(b, msgDelta, deltaVersion)
	b = appendStr(b, d.NodeID)
	b = binary.LittleEndian.AppendUint64(b, d.Epoch)
	b = binary.LittleEndian.AppendUint64(b, d.FromSeq)
	b = binary.LittleEndian.AppendUint64(b, d.ToSeq)
	b = binary.LittleEndian.AppendUint64(b, uint64(d.EmitUnix))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(d.Events)))
	for i := 0; i < len(d.Events); i += 8 {
		var bits byte
		for j := 0; j < 8 && i+j < len(d.Events); j++ {
			if d.Events[i+j].Added {
				bits |= 1 << j
			}
		}
		b = append(b, bits)
	}
	for _, e := range d.Events {
		b = binary.LittleEndian.AppendUint64(b, e.Hash)
	}
	return b, nil
}

// UnmarshalBinary decodes a delta, reusing d.Events' storage. It rejects other types and
// versions, counts that disagree with the length, reversed sequences and trailing bytes.
func (d *Delta) UnmarshalBinary(b []byte) error {
	if len(b) > MaxPacketBytes {
		return fmt.Errorf("decode delta: %w: %d bytes", ErrTooLarge, len(b))
	}
	r := reader{b: b}
	typ, ver := r.byte(), r.byte()
	if r.err == nil && typ != msgDelta {
		return fmt.Errorf("decode delta: %w: type %d", ErrInvalid, typ)
	}
	if r.err == nil && ver != deltaVersion {
		return fmt.Errorf("decode delta: %w: version %d", ErrVersion, ver)
	}
	id := r.str(MaxNodeIDBytes)
	epoch, from, to, emit := r.u64(), r.u64(), r.u64(), int64(r.u64())
	n := int(r.u16())
	bits := r.bytes((n + 7) / 8)
	hashes := r.bytes(8 * n)
	if r.err != nil {
		return fmt.Errorf("decode delta: %w", r.err)
	}
	if len(r.b) != 0 {
		return fmt.Errorf("decode delta: %w: %d trailing bytes", ErrInvalid, len(r.b))
	}
	if id == "" || to < from {
		return fmt.Errorf("decode delta: %w: node %q seq %d..%d", ErrInvalid, id, from, to)
	}
	d.NodeID, d.Epoch, d.FromSeq, d.ToSeq, d.EmitUnix = id, epoch, from, to, emit
	d.Events = d.Events[:0]
	for i := 0; i < n; i++ {
		d.Events = append(d.Events, Event{
			Hash:  binary.LittleEndian.Uint64(hashes[8*i:]),
			Added: bits[i/8]&(1<<(i%8)) != 0,
		})
	}
	return nil
}
