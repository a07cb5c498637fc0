package pins

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"slices"

	"github.com/hashicorp/raft"
)

// Snapshot format:
//
//	"PMPS" | snapshotVersion | uvarint applied
//	| count, adapters (uvarint id, str name, str base model, str revision, uvarint version)
//	| count, pins     (uvarint adapter, strs nodes, uvarint version)
//	| count, prefixes (uvarint adapter, u32s tokens, strs nodes, uvarint version)
//	| count, servers  (str id, str addr)
//	| CRC32-C (Castagnoli, little endian) of everything before it
//
// Entries are written in sorted order, so equal tables give byte-identical snapshots.
const (
	snapshotMagic   = "PMPS"
	snapshotVersion = byte(1)
	// maxSnapshotBytes bounds what Restore reads: the table caps (MaxAdapters, MaxPrefixPins,
	// MaxTotalPrefixTokens at ≤ 5 bytes a token, pins of ≤ 33 KiB) stay below 192 MiB.
	maxSnapshotBytes = 192 << 20
	// maxServers bounds the server address registry: voters are a small, stable set; the
	// registry also keeps departed servers until they re-register, so allow a generous 1024.
	maxServers = 1024
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fsmSnapshot is the immutable copy Snapshot captured.
type fsmSnapshot struct{ st state }

var _ raft.FSMSnapshot = (*fsmSnapshot)(nil)

// Persist serialises the captured table with its checksum.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(encodeSnapshot(&s.st)); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("write pins snapshot: %w", err)
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot; the copy is garbage collected.
func (s *fsmSnapshot) Release() {}

func encodeSnapshot(st *state) []byte {
	v := st.view()
	var e encoder
	e.b = append(e.b, snapshotMagic...)
	e.u8(snapshotVersion)
	e.uvarint(v.AppliedIndex)
	e.uvarint(uint64(len(v.Adapters)))
	for _, a := range v.Adapters {
		e.uvarint(a.ID)
		e.str(a.Name)
		e.str(a.BaseModel)
		e.str(a.Revision)
		e.uvarint(a.Version)
	}
	e.uvarint(uint64(len(v.Pins)))
	for _, p := range v.Pins {
		e.uvarint(p.AdapterID)
		e.strs(p.Nodes)
		e.uvarint(p.Version)
	}
	e.uvarint(uint64(len(v.Prefixes)))
	for _, p := range v.Prefixes {
		e.uvarint(p.AdapterID)
		e.u32s(p.Tokens)
		e.strs(p.Nodes)
		e.uvarint(p.Version)
	}
	ids := slices.Sorted(maps.Keys(st.servers))
	e.uvarint(uint64(len(ids)))
	for _, id := range ids {
		e.str(id)
		e.str(st.servers[id])
	}
	return binary.LittleEndian.AppendUint32(e.b, crc32.Checksum(e.b, castagnoli))
}

// readSnapshot reads and checks a whole snapshot.
func readSnapshot(r io.Reader) (state, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxSnapshotBytes+1))
	if err != nil {
		return state{}, fmt.Errorf("read: %w", err)
	}
	if len(b) > maxSnapshotBytes {
		return state{}, fmt.Errorf("%w: snapshot over %d bytes", ErrCorrupt, maxSnapshotBytes)
	}
	return decodeSnapshot(b)
}

// decodeSnapshot checks the trailer, then decodes and validates every entry. It never panics.
func decodeSnapshot(b []byte) (state, error) {
	if len(b) < len(snapshotMagic)+1+4 {
		return state{}, fmt.Errorf("%w: snapshot of %d bytes is truncated", ErrCorrupt, len(b))
	}
	body, trailer := b[:len(b)-4], b[len(b)-4:]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(trailer); got != want {
		return state{}, fmt.Errorf("%w: snapshot checksum %08x, want %08x", ErrCorrupt, got, want)
	}
	if !bytes.HasPrefix(body, []byte(snapshotMagic)) {
		return state{}, fmt.Errorf("%w: not a pins snapshot", ErrCorrupt)
	}
	d := decoder{b: body[len(snapshotMagic):]}
	if v := d.u8(); v != snapshotVersion {
		return state{}, fmt.Errorf("%w: unknown snapshot version %d", ErrCorrupt, v)
	}
	st := newState()
	st.applied = d.uvarint()
	bad := func(err error) (state, error) { return state{}, fmt.Errorf("%w: %w", ErrCorrupt, err) }

	n := d.count(MaxAdapters, 5)
	var prev uint64
	for i := 0; i < n && d.err == nil; i++ {
		a := Adapter{ID: d.uvarint(), Name: d.str(MaxNameLen), BaseModel: d.str(MaxBaseModelLen),
			Revision: d.str(MaxRevisionLen), Version: d.uvarint()}
		if d.err != nil {
			break
		}
		if err := validateAdapter(a); err != nil {
			return bad(err)
		}
		if i > 0 && a.ID <= prev {
			return bad(fmt.Errorf("adapters out of order"))
		}
		prev = a.ID
		st.adapters[a.ID] = a
	}
	n = d.count(MaxAdapters, 3)
	for i := 0; i < n && d.err == nil; i++ {
		p := AdapterPin{AdapterID: d.uvarint(), Nodes: d.strs(MaxPinNodes, MaxNodeIDLen), Version: d.uvarint()}
		if d.err != nil {
			break
		}
		if err := checkNodes(p.Nodes); err != nil {
			return bad(err)
		}
		if _, ok := st.adapters[p.AdapterID]; !ok {
			return bad(fmt.Errorf("pin of unknown adapter %d", p.AdapterID))
		}
		if _, dup := st.pins[p.AdapterID]; dup {
			return bad(fmt.Errorf("duplicate pin of adapter %d", p.AdapterID))
		}
		st.pins[p.AdapterID] = p
	}
	n = d.count(MaxPrefixPins, 4)
	for i := 0; i < n && d.err == nil; i++ {
		p := PrefixPin{AdapterID: d.uvarint(), Tokens: d.u32s(MaxPrefixTokens), Nodes: d.strs(MaxPinNodes, MaxNodeIDLen), Version: d.uvarint()}
		if d.err != nil {
			break
		}
		if err := cmp.Or(checkTokens(p.Tokens), checkNodes(p.Nodes)); err != nil {
			return bad(err)
		}
		if _, ok := st.adapters[p.AdapterID]; !ok {
			return bad(fmt.Errorf("prefix pin of unknown adapter %d", p.AdapterID))
		}
		p.Hash = PrefixHash(p.AdapterID, p.Tokens)
		if _, dup := st.prefixes[p.Key()]; dup {
			return bad(fmt.Errorf("duplicate prefix pin %016x", p.Hash))
		}
		st.tokens += len(p.Tokens)
		if st.tokens > MaxTotalPrefixTokens {
			return bad(fmt.Errorf("more than %d pinned tokens", MaxTotalPrefixTokens))
		}
		st.prefixes[p.Key()] = p
	}
	n = d.count(maxServers, 2)
	for i := 0; i < n && d.err == nil; i++ {
		id, addr := d.str(MaxNodeIDLen), d.str(MaxServerAddrLen)
		if d.err == nil {
			st.servers[id] = addr
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return state{}, d.err
	}
	return st, nil
}
