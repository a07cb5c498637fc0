package cluster

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// Router-to-router sharing (routing/POLICIES.md, "Many routers"): routers tell each other what only they know — the
// requests they route (decisions) and their in-flight load per node — in best-effort packets to
// every other router member, the same path as node → router deltas. This file is the wire
// format and the agent's two hooks; router/peershare owns what to send and what to do on receipt
// (it feeds routing.Decider). Nothing here reaches the summary index: what a node caches still
// comes only from the node.
//
//	decision: msgShare, version, shareDecision, router id, node id, uvarint offset (the first
//	          hash's position in the request's chain), uvarint count, count × 8-byte hash
//	load:     msgShare, version, shareLoad, router id, 8-byte report time (unix ns), part, parts
//	          (1 byte each), uvarint count, count × (node id, uvarint requests, tokens, prefill)
//	ttft:     msgShare, version, shareTTFT, router id, uvarint count, count × (node id, uvarint
//	          work µs, uvarint sequences, uvarint time to first token µs)
//
// A ttft packet carries first tokens the router observed, with the features its policy saw, so
// that its peers learn each node's TTFT from them too (routing.Decider.PeerTTFT).
// routing.ShareDecisionBytes, ShareLoadBytes and ShareTTFTBytes state the same sizes, and the
// packing rules (routing.AppendShareChunks, AppendLoadParts, AppendTTFTParts) keep every packet
// within MaxPacketBytes.

const (
	msgShare     byte = 4 // router → routers (this file)
	shareVersion byte = 1

	shareDecision byte = 1
	shareLoad     byte = 2
	shareTTFT     byte = 3
)

// MaxShareHashes bounds a decision packet's hashes: what fits MaxPacketBytes with the shortest ids.
const MaxShareHashes = (MaxPacketBytes - 10) / 8

// MaxShareLoads bounds a load packet's entries: each takes at least 5 bytes (a 1-byte id).
const MaxShareLoads = MaxPacketBytes / 5

// ShareDecision is one router's routing decision, or the part of it a packet carries: a request
// whose block hashes from Offset on are Hashes went to NodeID.
type ShareDecision struct {
	RouterID string
	NodeID   string
	Offset   int
	Hashes   []uint64
}

// ShareLoad is one packet (Part of Parts) of a router's in-flight load report.
type ShareLoad struct {
	RouterID    string
	AtUnix      int64
	Part, Parts int
	Loads       []routing.NodeInFlight
}

// ShareTTFT is one packet of a router's first-token observations.
type ShareTTFT struct {
	RouterID string
	Obs      []routing.TTFTObservation
}

// MaxShareTTFTs bounds a first-token packet's observations: each takes at least 5 bytes.
const MaxShareTTFTs = MaxPacketBytes / 5

// ShareKind returns a share packet's kind (IsShareDecision, IsShareLoad, IsShareTTFT), 0 for
// another packet.
func ShareKind(b []byte) byte {
	if len(b) < 3 || b[0] != msgShare {
		return 0
	}
	return b[2]
}

// IsShareDecision reports whether b is a decision packet.
func IsShareDecision(b []byte) bool { return ShareKind(b) == shareDecision }

// IsShareLoad reports whether b is a load packet.
func IsShareLoad(b []byte) bool { return ShareKind(b) == shareLoad }

// IsShareTTFT reports whether b is a first-token packet.
func IsShareTTFT(b []byte) bool { return ShareKind(b) == shareTTFT }

func checkID(what, id string) error {
	if len(id) == 0 || len(id) > MaxNodeIDBytes {
		return fmt.Errorf("%w: %s id of %d bytes", ErrInvalid, what, len(id))
	}
	return nil
}

// AppendBinary appends d's encoding; it refuses one that exceeds MaxPacketBytes.
func (d *ShareDecision) AppendBinary(b []byte) ([]byte, error) {
	if err := checkID("router", d.RouterID); err != nil {
		return nil, fmt.Errorf("encode share decision: %w", err)
	}
	if err := checkID("node", d.NodeID); err != nil {
		return nil, fmt.Errorf("encode share decision: %w", err)
	}
	if d.Offset < 0 {
		return nil, fmt.Errorf("encode share decision: %w: offset %d", ErrInvalid, d.Offset)
	}
	if n := routing.ShareDecisionBytes(d.RouterID, d.NodeID, d.Offset, len(d.Hashes)); n > MaxPacketBytes {
		return nil, fmt.Errorf("encode share decision: %w: %d bytes", ErrTooLarge, n)
	}
	b = append(b, msgShare, shareVersion, shareDecision)
	b = appendStr(b, d.RouterID)
	b = appendStr(b, d.NodeID)
	b = binary.AppendUvarint(b, uint64(d.Offset))
	b = binary.AppendUvarint(b, uint64(len(d.Hashes)))
	for _, h := range d.Hashes {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b, nil
}

func shareHeader(r *reader, kind byte) error {
	if t, v, k := r.byte(), r.byte(), r.byte(); r.err == nil && (t != msgShare || v != shareVersion || k != kind) {
		return fmt.Errorf("%w: share packet type %d version %d kind %d", ErrInvalid, t, v, k)
	}
	return r.err
}

// UnmarshalBinary decodes a decision packet, reusing d.Hashes' memory.
func (d *ShareDecision) UnmarshalBinary(b []byte) error {
	r := reader{b: b}
	if err := shareHeader(&r, shareDecision); err != nil {
		return fmt.Errorf("decode share decision: %w", err)
	}
	d.RouterID = r.str(MaxNodeIDBytes)
	d.NodeID = r.str(MaxNodeIDBytes)
	off := r.uvarint()
	n := r.uvarint()
	if r.err == nil && (n > MaxShareHashes || off > 1<<31) {
		r.fail(fmt.Errorf("%w: %d hashes at offset %d", ErrInvalid, n, off))
	}
	d.Hashes = d.Hashes[:0]
	for i := uint64(0); r.err == nil && i < n; i++ {
		d.Hashes = append(d.Hashes, r.u64())
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Errorf("%w: %d trailing bytes", ErrInvalid, len(r.b)))
	}
	if r.err == nil && (d.RouterID == "" || d.NodeID == "") {
		r.fail(fmt.Errorf("%w: empty id", ErrInvalid))
	}
	if r.err != nil {
		return fmt.Errorf("decode share decision: %w", r.err)
	}
	d.Offset = int(off)
	return nil
}

// AppendBinary appends l's encoding; it refuses one that exceeds MaxPacketBytes.
func (l *ShareLoad) AppendBinary(b []byte) ([]byte, error) {
	if err := checkID("router", l.RouterID); err != nil {
		return nil, fmt.Errorf("encode share load: %w", err)
	}
	if l.Parts <= 0 || l.Parts > routing.MaxLoadParts || l.Part < 0 || l.Part >= l.Parts {
		return nil, fmt.Errorf("encode share load: %w: part %d of %d", ErrInvalid, l.Part, l.Parts)
	}
	for i := range l.Loads {
		e := &l.Loads[i]
		if err := checkID("node", e.Node); err != nil {
			return nil, fmt.Errorf("encode share load: %w", err)
		}
		if e.Requests < 0 || e.Tokens < 0 || e.PrefillTokens < 0 {
			return nil, fmt.Errorf("encode share load: %w: negative load %+v", ErrInvalid, e.InFlight)
		}
	}
	if n := routing.ShareLoadBytes(l.RouterID, l.Loads); n > MaxPacketBytes {
		return nil, fmt.Errorf("encode share load: %w: %d bytes", ErrTooLarge, n)
	}
	b = append(b, msgShare, shareVersion, shareLoad)
	b = appendStr(b, l.RouterID)
	b = binary.LittleEndian.AppendUint64(b, uint64(l.AtUnix))
	b = append(b, byte(l.Part), byte(l.Parts))
	b = binary.AppendUvarint(b, uint64(len(l.Loads)))
	for i := range l.Loads {
		e := &l.Loads[i]
		b = appendStr(b, e.Node)
		b = binary.AppendUvarint(b, uint64(e.Requests))
		b = binary.AppendUvarint(b, uint64(e.Tokens))
		b = binary.AppendUvarint(b, uint64(e.PrefillTokens))
	}
	return b, nil
}

// maxShareCount bounds a decoded load figure: far above any real count, and it keeps sums of a
// few hundred peers far from overflowing an int.
const maxShareCount = 1 << 40

// UnmarshalBinary decodes a load packet, reusing l.Loads' memory.
func (l *ShareLoad) UnmarshalBinary(b []byte) error {
	r := reader{b: b}
	if err := shareHeader(&r, shareLoad); err != nil {
		return fmt.Errorf("decode share load: %w", err)
	}
	l.RouterID = r.str(MaxNodeIDBytes)
	l.AtUnix = int64(r.u64())
	part, parts := int(r.byte()), int(r.byte())
	n := r.uvarint()
	if r.err == nil && (parts == 0 || parts > routing.MaxLoadParts || part >= parts || n > MaxShareLoads) {
		r.fail(fmt.Errorf("%w: part %d of %d, %d entries", ErrInvalid, part, parts, n))
	}
	l.Loads = l.Loads[:0]
	for i := uint64(0); r.err == nil && i < n; i++ {
		var e routing.NodeInFlight
		e.Node = r.str(MaxNodeIDBytes)
		q, t, p := r.uvarint(), r.uvarint(), r.uvarint()
		if r.err == nil && (e.Node == "" || q > maxShareCount || t > maxShareCount || p > maxShareCount) {
			r.fail(fmt.Errorf("%w: load entry %q %d %d %d", ErrInvalid, e.Node, q, t, p))
		}
		e.Requests, e.Tokens, e.PrefillTokens = int(q), int(t), int(p)
		l.Loads = append(l.Loads, e)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Errorf("%w: %d trailing bytes", ErrInvalid, len(r.b)))
	}
	if r.err == nil && l.RouterID == "" {
		r.fail(fmt.Errorf("%w: empty router id", ErrInvalid))
	}
	if r.err != nil {
		return fmt.Errorf("decode share load: %w", r.err)
	}
	l.Part, l.Parts = part, parts
	return nil
}

// AppendBinary appends t's encoding; it refuses one that exceeds MaxPacketBytes or holds a
// negative figure.
func (t *ShareTTFT) AppendBinary(b []byte) ([]byte, error) {
	if err := checkID("router", t.RouterID); err != nil {
		return nil, fmt.Errorf("encode share ttft: %w", err)
	}
	for i := range t.Obs {
		o := &t.Obs[i]
		if err := checkID("node", o.Node); err != nil {
			return nil, fmt.Errorf("encode share ttft: %w", err)
		}
		if o.Work < 0 || o.Seqs < 0 || o.TTFT < 0 {
			return nil, fmt.Errorf("encode share ttft: %w: negative observation %+v", ErrInvalid, *o)
		}
	}
	if n := routing.ShareTTFTBytes(t.RouterID, t.Obs); n > MaxPacketBytes {
		return nil, fmt.Errorf("encode share ttft: %w: %d bytes", ErrTooLarge, n)
	}
	b = append(b, msgShare, shareVersion, shareTTFT)
	b = appendStr(b, t.RouterID)
	b = binary.AppendUvarint(b, uint64(len(t.Obs)))
	for i := range t.Obs {
		o := &t.Obs[i]
		b = appendStr(b, o.Node)
		b = binary.AppendUvarint(b, uint64(o.Work.Microseconds()))
		b = binary.AppendUvarint(b, uint64(o.Seqs))
		b = binary.AppendUvarint(b, uint64(o.TTFT.Microseconds()))
	}
	return b, nil
}

// maxShareMicros bounds a decoded duration: a day, far beyond what the learner keeps (a minute).
const maxShareMicros = uint64(24 * time.Hour / time.Microsecond)

// UnmarshalBinary decodes a first-token packet, reusing t.Obs' memory.
func (t *ShareTTFT) UnmarshalBinary(b []byte) error {
	r := reader{b: b}
	if err := shareHeader(&r, shareTTFT); err != nil {
		return fmt.Errorf("decode share ttft: %w", err)
	}
	t.RouterID = r.str(MaxNodeIDBytes)
	n := r.uvarint()
	if r.err == nil && n > MaxShareTTFTs {
		r.fail(fmt.Errorf("%w: %d observations", ErrInvalid, n))
	}
	t.Obs = t.Obs[:0]
	for i := uint64(0); r.err == nil && i < n; i++ {
		var o routing.TTFTObservation
		o.Node = r.str(MaxNodeIDBytes)
		w, s, y := r.uvarint(), r.uvarint(), r.uvarint()
		if r.err == nil && (o.Node == "" || w > maxShareMicros || s > maxShareCount || y > maxShareMicros) {
			r.fail(fmt.Errorf("%w: observation %q %d %d %d", ErrInvalid, o.Node, w, s, y))
		}
		o.Work, o.Seqs, o.TTFT = time.Duration(w)*time.Microsecond, int(s), time.Duration(y)*time.Microsecond
		t.Obs = append(t.Obs, o)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Errorf("%w: %d trailing bytes", ErrInvalid, len(r.b)))
	}
	if r.err == nil && t.RouterID == "" {
		r.fail(fmt.Errorf("%w: empty router id", ErrInvalid))
	}
	if r.err != nil {
		return fmt.Errorf("decode share ttft: %w", r.err)
	}
	return nil
}

// SetShareHandler installs the receiver of share packets (router/peershare). h is called from
// memberlist's delivery goroutine with a copy of the packet it may keep: it must not block
// (enqueue on a bounded queue and count drops). Set it before Start; nil drops share packets.
func (a *Agent) SetShareHandler(h func(b []byte)) {
	if h == nil {
		a.share.Store(nil)
		return
	}
	a.share.Store(&h)
}

// SendShare sends a share packet best effort to every other router member.
func (a *Agent) SendShare(b []byte) { a.sendToRouters(b) }

// receivedShare hands a share packet (already copied) to the handler.
func (a *Agent) receivedShare(b []byte) {
	a.metrics.received(b[0], len(b))
	h := a.share.Load()
	if h == nil {
		a.metrics.drop("share_unhandled")
		return
	}
	(*h)(b)
}
