package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// bpeModel is HF's BPE model. In byte-level mode the model works on raw bytes: each byte is one
// initial symbol (its alphabet character's id) and vocabulary lookups use the bytes a token
// stands for, which is the same as HF mapping the piece to the alphabet first.
type bpeModel struct {
	vocab  map[string]uint32 // token text (alphabet form) → id
	tokens map[uint32]string // id → token text
	merges map[uint64]mergeTo
	// byte-level mode
	byteLevel bool
	byteIDs   [256]uint32
	rawVocab  map[string]uint32 // raw bytes → id, for ignore_merges
	// SentencePiece-style mode
	byteFallback bool
	fallbackIDs  [256]uint32 // <0xHH>
	unk          int64       // -1: no unk token
	fuseUnk      bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix

	ignoreMerges bool

	// splitMeta: a word may be cut before each ▁ that follows a character c listed in vocab
	// on its own and not in noCut (the characters some token has right before a ▁): no token
	// can span such a cut, so merging the parts separately gives the ids of merging the whole
	// (SentencePiece-style models merge whole pieces; this lets the word cache serve them).
	splitMeta bool
	noCut     map[rune]bool
}

// metaspace is SentencePiece's word-boundary character.
const metaspace = '\u2581'

func (m *bpeModel) initMetaSplit() {
	if m.byteLevel || m.ignoreMerges || m.prefix != "" || m.suffix != "" {
		return // ignore_merges looks words up whole; prefixes and suffixes depend on word edges
	}
	if _, ok := m.vocab[string(metaspace)]; !ok {
		return
	}
	m.noCut = map[rune]bool{}
	for tok := range m.vocab {
		prev := rune(-1)
		for _, r := range tok {
			if r == metaspace && prev >= 0 && prev != metaspace {
				m.noCut[prev] = true
			}
			prev = r
		}
	}
	m.splitMeta = true
}

// metaCuts calls fn with the parts of w between safe cuts (see splitMeta).
func (m *bpeModel) metaCuts(w string, fn func(part string)) {
	start := 0
	prev := rune(-1)
	prevAt := 0
	for i, r := range w {
		if r == metaspace && prev >= 0 && prev != metaspace && !m.noCut[prev] {
			if _, ok := m.vocab[w[prevAt:i]]; ok {
				fn(w[start:i])
				start = i
			}
		}
		prev, prevAt = r, i
	}
	fn(w[start:])
}

type mergeTo struct {
	rank uint32
	id   uint32
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

func parseBPE(raw json.RawMessage, byteLevel bool) (*bpeModel, error) {
	typ, err := typedKind(raw, "model")
	if err != nil {
		return nil, err
	}
	if typ != "BPE" {
		if typ == "" {
			return nil, fmt.Errorf("missing model")
		}
		return nil, unsupported("model %q (only BPE is implemented)", typ)
	}
	var p struct {
		Dropout      *float64          `json:"dropout"`
		UnkToken     *string           `json:"unk_token"`
		Prefix       *string           `json:"continuing_subword_prefix"`
		Suffix       *string           `json:"end_of_word_suffix"`
		FuseUnk      bool              `json:"fuse_unk"`
		ByteFallback bool              `json:"byte_fallback"`
		IgnoreMerges bool              `json:"ignore_merges"`
		Vocab        map[string]uint32 `json:"vocab"`
		Merges       []json.RawMessage `json:"merges"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, err
	}
	if p.Dropout != nil && *p.Dropout != 0 {
		return nil, unsupported("BPE dropout %v (random)", *p.Dropout)
	}
	m := &bpeModel{
		vocab: p.Vocab, tokens: make(map[uint32]string, len(p.Vocab)), merges: make(map[uint64]mergeTo, len(p.Merges)),
		byteLevel: byteLevel, byteFallback: p.ByteFallback, fuseUnk: p.FuseUnk, ignoreMerges: p.IgnoreMerges, unk: -1,
	}
	if p.Prefix != nil {
		m.prefix = *p.Prefix
	}
	if p.Suffix != nil {
		m.suffix = *p.Suffix
	}
	for tok, id := range p.Vocab {
		m.tokens[id] = tok
	}
	if p.UnkToken != nil {
		id, ok := p.Vocab[*p.UnkToken]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocabulary", *p.UnkToken)
		}
		m.unk = int64(id)
	}
	for rank, mr := range p.Merges {
		a, b, err := parseMerge(mr)
		if err != nil {
			return nil, fmt.Errorf("merges[%d]: %w", rank, err)
		}
		ia, oka := p.Vocab[a]
		ib, okb := p.Vocab[b]
		if !oka || !okb {
			return nil, fmt.Errorf("merges[%d]: %q or %q is not in the vocabulary", rank, a, b)
		}
		if !strings.HasPrefix(b, m.prefix) {
			return nil, fmt.Errorf("merges[%d]: %q lacks continuing_subword_prefix %q", rank, b, m.prefix)
		}
		nt := a + b[len(m.prefix):]
		id, ok := p.Vocab[nt]
		if !ok {
			return nil, fmt.Errorf("merges[%d]: merged token %q is not in the vocabulary", rank, nt)
		}
		k := pairKey(ia, ib)
		if _, dup := m.merges[k]; !dup { // HF keeps the first (lowest) rank of a repeated pair
			m.merges[k] = mergeTo{rank: uint32(rank), id: id}
		}
	}
	if byteLevel {
		if m.prefix != "" || m.suffix != "" || m.byteFallback || m.unk >= 0 && m.fuseUnk {
			return nil, unsupported("byte-level BPE with continuing_subword_prefix, end_of_word_suffix, byte_fallback or fuse_unk")
		}
		for b := 0; b < 256; b++ {
			id, ok := p.Vocab[string(byteToRune[b])]
			if !ok {
				return nil, unsupported("byte-level BPE whose vocabulary lacks the alphabet character for byte 0x%02X", b)
			}
			m.byteIDs[b] = id
		}
		m.rawVocab = make(map[string]uint32, len(p.Vocab))
		var buf []byte
		for tok, id := range p.Vocab {
			var ok bool
			if buf, ok = byteLevelDecode(buf[:0], tok); ok {
				m.rawVocab[string(buf)] = id
			}
		}
	}
	m.initMetaSplit()
	if m.byteFallback {
		for b := 0; b < 256; b++ {
			id, ok := p.Vocab[fmt.Sprintf("<0x%02X>", b)]
			if !ok {
				return nil, unsupported("byte_fallback whose vocabulary lacks <0x%02X>", b)
			}
			m.fallbackIDs[b] = id
		}
	}
	return m, nil
}

// parseMerge reads "a b" or ["a", "b"].
func parseMerge(raw json.RawMessage) (string, string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '[' {
		var ab []string
		if err := json.Unmarshal(raw, &ab); err != nil || len(ab) != 2 {
			return "", "", fmt.Errorf("want a pair of strings")
		}
		return ab[0], ab[1], nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", "", err
	}
	a, b, ok := strings.Cut(s, " ")
	if !ok {
		return "", "", fmt.Errorf("merge %q has no space", s)
	}
	return a, b, nil
}

// symbol is one node of the doubly linked list a word is merged in.
type symbol struct {
	id         uint32
	prev, next int32
	dead       bool
}

// mergeCand is a heap entry: merge the symbol at pos with its successor into id.
type mergeCand struct {
	rank uint32
	pos  int32
	id   uint32
}

func (a mergeCand) less(b mergeCand) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

type mergeState struct {
	syms []symbol
	heap []mergeCand
}

var mergePool = sync.Pool{New: func() any { return new(mergeState) }}

func (st *mergeState) push(c mergeCand) {
	h := append(st.heap, c)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	st.heap = h
}

func (st *mergeState) pop() mergeCand {
	h := st.heap
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].less(h[l]) {
			m = r
		}
		if !h[m].less(h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	st.heap = h
	return top
}

func (st *mergeState) add(id uint32) {
	n := int32(len(st.syms))
	st.syms = append(st.syms, symbol{id: id, prev: n - 1, next: n + 1})
}

// mergeAll runs HF's Word::merge_all: repeatedly apply the lowest-ranked merge, leftmost first.
func (m *bpeModel) mergeAll(st *mergeState) {
	syms := st.syms
	if len(syms) == 0 {
		return
	}
	syms[len(syms)-1].next = -1
	st.heap = st.heap[:0]
	for i := 0; i+1 < len(syms); i++ {
		if mt, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			st.push(mergeCand{rank: mt.rank, pos: int32(i), id: mt.id})
		}
	}
	for len(st.heap) > 0 {
		top := st.pop()
		cur := &syms[top.pos]
		if cur.dead || cur.next < 0 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		if mt, ok := m.merges[pairKey(cur.id, right.id)]; !ok || mt.id != top.id {
			continue // stale: one side changed since this candidate was pushed
		}
		cur.id = top.id
		cur.next = right.next
		syms[nextPos].dead = true
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if mt, ok := m.merges[pairKey(syms[cur.prev].id, cur.id)]; ok {
				st.push(mergeCand{rank: mt.rank, pos: cur.prev, id: mt.id})
			}
		}
		if cur.next >= 0 {
			if mt, ok := m.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
				st.push(mergeCand{rank: mt.rank, pos: top.pos, id: mt.id})
			}
		}
	}
}

// appendTokens appends the ids of one pre-tokenized word.
func (m *bpeModel) appendTokens(dst []uint32, w string) []uint32 {
	if w == "" {
		return dst
	}
	if m.ignoreMerges {
		if m.byteLevel {
			if id, ok := m.rawVocab[w]; ok {
				return append(dst, id)
			}
		} else if id, ok := m.vocab[w]; ok {
			return append(dst, id)
		}
	}
	st := mergePool.Get().(*mergeState)
	st.syms = st.syms[:0]
	if m.byteLevel {
		for i := 0; i < len(w); i++ {
			st.add(m.byteIDs[w[i]])
		}
	} else {
		m.initialSymbols(st, w)
	}
	m.mergeAll(st)
	for i := 0; i >= 0 && i < len(st.syms); i = int(st.syms[i].next) {
		dst = append(dst, st.syms[i].id)
	}
	if cap(st.syms) <= maxPooledRunes && cap(st.heap) <= maxPooledRunes {
		mergePool.Put(st)
	}
	return dst
}

// initialSymbols is HF's BPE::merge_word before merging: one symbol per character, with the
// continuing-subword prefix and end-of-word suffix, byte fallback, and (fused) unknowns.
func (m *bpeModel) initialSymbols(st *mergeState, w string) {
	unkPending := false
	var sb []byte
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		ch := w[i : i+n]
		first, last := i == 0, i+n == len(w)
		i += n
		key := ch
		if (!first && m.prefix != "") || (last && m.suffix != "") {
			sb = sb[:0]
			if !first {
				sb = append(sb, m.prefix...)
			}
			sb = append(sb, ch...)
			if last {
				sb = append(sb, m.suffix...)
			}
			key = string(sb)
		}
		if id, ok := m.vocab[key]; ok {
			if unkPending {
				st.add(uint32(m.unk))
				unkPending = false
			}
			st.add(id)
			continue
		}
		if m.byteFallback {
			// Every <0xHH> exists (checked at load), so the bytes are always found; HF adds
			// them without flushing a pending unknown, and so does this.
			for j := 0; j < len(key); j++ {
				st.add(m.fallbackIDs[key[j]])
			}
			continue
		}
		if m.unk >= 0 {
			if unkPending && !m.fuseUnk {
				st.add(uint32(m.unk))
			}
			unkPending = true
		}
	}
	if unkPending {
		st.add(uint32(m.unk))
	}
}
