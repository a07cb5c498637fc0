package kvevents

// Checkpoints: the mirror and each rank's position in the engine's stream, written to local disk
// by the node agent (--state-dir) so that a restarted agent starts from what it knew instead of
// an empty, partial mirror. A restored rank is cold until the follower knows what happened while
// the agent was down: the gap since the checkpoint replayed (exact again), or, when it cannot be
// replayed, a partial mirror whose restored copies are provisional (CacheMirror: confirmed when the
// engine stores the block again, dropped when it removes it). An engine restart meanwhile (its
// sequence or its start time) drops the checkpoint.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// RankSeq is a rank's position as a checkpoint records it: the last batch applied (its sequence
// and the xxhash of its payload, to recognise the same engine incarnation in a replay) and
// whether the mirror was exact.
type RankSeq struct {
	Have     bool
	Last     uint64
	Sum      uint64
	Complete bool
}

// Checkpoint is what ReadCheckpoint returns besides the mirror.
type Checkpoint struct {
	Ranks []RankSeq // by rank
	// EngineStart is the engine's process_start_time_seconds when the checkpoint was written (0
	// unknown): a different value at the agent's first probe means the engine restarted.
	EngineStart float64
}

// ckptMagic names the format: version 2 holds six tiers' copies per node (storage and remote
// were added), so a version-1 file is refused rather than misread.
var ckptMagic = [8]byte{'P', 'M', 'K', 'V', 'C', 'K', '2', '\n'}

// Caps on what a checkpoint may ask ReadCheckpoint to build: a file from another version or a
// corrupt one is refused, never allowed to claim unbounded memory.
const (
	maxCkptNodes = 1 << 26 // 64M blocks, far beyond any engine's cache
	maxCkptRanks = MaxDPSize
)

// ErrCheckpoint wraps every ReadCheckpoint error.
var ErrCheckpoint = errors.New("kvevents: bad checkpoint")

// setSeq records rank's position (under m.mu, so a checkpoint pairs it with the contents).
func (m *CacheMirror) setSeq(rank int, s RankSeq) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seqs[rank] = s
}

// ConfirmRestored marks every restored copy of rank as confirmed: the gap since the checkpoint
// was replayed, so the mirror is what the engine holds.
func (m *CacheMirror) ConfirmRestored(rank int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.nodes {
		n := &m.nodes[i]
		if n.prov != 0 && int(n.key.src>>16) == rank {
			m.stats.Provisional -= int(n.prov)
			n.prov = 0
		}
	}
}

// AppendCheckpoint appends the mirror's checkpoint for dpSize ranks to buf, with the engine's
// start time. The mirror is locked while it is serialised (a copy-speed loop over the arena).
func (m *CacheMirror) AppendCheckpoint(buf []byte, dpSize int, engineStart float64) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	buf = append(buf, ckptMagic[:]...)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(m.blockSize))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(dpSize))
	buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(engineStart))
	for r := 0; r < dpSize; r++ {
		s := m.seqs[r]
		var flags byte
		if s.Have {
			flags |= 1
		}
		if s.Complete {
			flags |= 2
		}
		buf = append(buf, flags)
		buf = binary.LittleEndian.AppendUint64(buf, s.Last)
		buf = binary.LittleEndian.AppendUint64(buf, s.Sum)
	}
	// Live nodes in arena order, numbered densely; parents are referred to by that number.
	num := make(map[int32]uint32, len(m.byKey))
	for i := range m.nodes {
		if j, ok := m.byKey[m.nodes[i].key]; ok && j == int32(i) {
			num[int32(i)] = uint32(len(num))
		}
	}
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(num)))
	for i := range m.nodes {
		n := &m.nodes[i]
		if j, ok := m.byKey[n.key]; !ok || j != int32(i) {
			continue
		}
		buf = binary.LittleEndian.AppendUint64(buf, n.key.hash)
		buf = binary.LittleEndian.AppendUint32(buf, n.key.src)
		parent := uint32(math.MaxUint32) // unknown (a placeholder's)
		switch {
		case n.parent == rootNode:
			parent = math.MaxUint32 - 1
		case n.parent >= 0:
			parent = num[n.parent]
		}
		buf = binary.LittleEndian.AppendUint32(buf, parent)
		buf = binary.LittleEndian.AppendUint64(buf, n.canon)
		for t := range n.copies {
			buf = binary.LittleEndian.AppendUint32(buf, n.copies[t])
		}
		buf = append(buf, n.flags&^fVisible, n.prov)
		toks := m.pending[int32(i)]
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(toks)))
		for _, t := range toks {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
	}
	return buf
}

// ReadCheckpoint rebuilds a mirror from a checkpoint written for blockSize and dpSize ranks.
// Every GPU copy it restores is provisional (see CacheMirror). A checkpoint for another block size or
// rank count is refused.
func ReadCheckpoint(r io.Reader, blockSize, dpSize int) (*CacheMirror, Checkpoint, error) {
	br := bufio.NewReader(r)
	bad := func(format string, args ...any) (*CacheMirror, Checkpoint, error) {
		return nil, Checkpoint{}, fmt.Errorf("%w: %s", ErrCheckpoint, fmt.Sprintf(format, args...))
	}
	var hdr [8 + 4 + 4 + 8]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return bad("header: %v", err)
	}
	if [8]byte(hdr[:8]) != ckptMagic {
		return bad("not a mirror checkpoint of this version")
	}
	if bs := binary.LittleEndian.Uint32(hdr[8:]); int(bs) != blockSize {
		return bad("written for block size %d, not %d", bs, blockSize)
	}
	if n := binary.LittleEndian.Uint32(hdr[12:]); int(n) != dpSize || n > maxCkptRanks {
		return bad("written for %d ranks, not %d", n, dpSize)
	}
	ck := Checkpoint{EngineStart: math.Float64frombits(binary.LittleEndian.Uint64(hdr[16:]))}
	for range dpSize {
		var b [17]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return bad("ranks: %v", err)
		}
		ck.Ranks = append(ck.Ranks, RankSeq{Have: b[0]&1 != 0, Complete: b[0]&2 != 0,
			Last: binary.LittleEndian.Uint64(b[1:]), Sum: binary.LittleEndian.Uint64(b[9:])})
	}
	var nb [4]byte
	if _, err := io.ReadFull(br, nb[:]); err != nil {
		return bad("node count: %v", err)
	}
	count := binary.LittleEndian.Uint32(nb[:])
	if count > maxCkptNodes {
		return bad("%d nodes (max %d)", count, maxCkptNodes)
	}
	m := NewCacheMirror(blockSize)
	parents := make([]uint32, 0, min(count, 1<<20))
	const fixed = 8 + 4 + 4 + 8 + 4*numTiers + 2 + 4
	var rec [fixed]byte
	for i := uint32(0); i < count; i++ {
		if _, err := io.ReadFull(br, rec[:]); err != nil {
			return bad("node %d: %v", i, err)
		}
		k := mkey{hash: binary.LittleEndian.Uint64(rec[0:]), src: binary.LittleEndian.Uint32(rec[8:])}
		if int(k.src>>16) >= dpSize {
			return bad("node %d of rank %d", i, k.src>>16)
		}
		if _, dup := m.byKey[k]; dup {
			return bad("node %d repeats a key", i)
		}
		idx := m.get(k)
		if idx != int32(i) {
			return bad("node %d out of order", i)
		}
		n := &m.nodes[idx]
		parents = append(parents, binary.LittleEndian.Uint32(rec[12:]))
		n.canon = binary.LittleEndian.Uint64(rec[16:])
		for t := range n.copies {
			n.copies[t] = binary.LittleEndian.Uint32(rec[24+4*t:])
		}
		n.flags = rec[24+4*numTiers] & (fKnown | fMatch | fCanon | fDead)
		n.prov = uint8(min(n.copies[TierGPU], math.MaxUint8)) // everything restored is provisional
		ntok := binary.LittleEndian.Uint32(rec[24+4*numTiers+2:])
		if ntok > 0 {
			if ntok > uint32(blockSize) || n.flags&(fKnown|fCanon|fDead) != fKnown {
				return bad("node %d keeps %d tokens", i, ntok)
			}
			toks := make([]uint32, ntok)
			for j := range toks {
				var tb [4]byte
				if _, err := io.ReadFull(br, tb[:]); err != nil {
					return bad("node %d tokens: %v", i, err)
				}
				toks[j] = binary.LittleEndian.Uint32(tb[:])
			}
			m.pending[idx] = toks
			m.stats.Orphans++
		}
		if n.flags&fKnown != 0 {
			m.stats.Blocks++
			m.addGroup(k.src>>16, uint16(k.src))
		} else if n.copies != ([numTiers]uint32{}) {
			return bad("placeholder %d holds copies", i)
		}
		for t := range n.copies {
			m.stats.Tiers[t] += int(n.copies[t])
		}
		m.stats.Provisional += int(n.prov)
		if n.flags&fCanon != 0 {
			m.lowerAll(idx, 1)
		}
		// Which tiers remove their blocks is not recorded: every restored lower-tier copy ages
		// as if its tier never did, until the tier's next removal says otherwise.
		expiry := m.now().Add(m.ttl).UnixNano()
		for t := TierGPU + 1; t < numTiers; t++ {
			for range n.copies[t] {
				m.enqueueAging(idx, t, expiry)
			}
		}
	}
	// Links, then visibility from the roots down (show cascades to visible children).
	for i, p := range parents {
		c := int32(i)
		switch {
		case p == math.MaxUint32:
		case p == math.MaxUint32-1:
			m.nodes[c].parent = rootNode
		case p < count && p != uint32(i):
			if m.nodes[p].key.src != m.nodes[c].key.src || m.cycles(c, int32(p)) {
				return bad("node %d has a bad parent", i)
			}
			m.link(c, int32(p))
		default:
			return bad("node %d has parent %d", i, p)
		}
	}
	for i := range m.nodes {
		if m.nodes[i].parent == rootNode && m.shouldShow(int32(i)) {
			m.show(int32(i))
		}
	}
	for r, s := range ck.Ranks {
		m.seqs[r] = s
	}
	return m, ck, nil
}
