package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// Tokenizer encodes text to a model's token ids. It is safe for concurrent use.
type Tokenizer struct {
	normalizer normalizer // nil: none
	pre        preSeq     // empty: the whole piece is one word
	model      *bpeModel
	decoder    decoder
	post       postProcessor

	added          []addedToken
	addedByContent map[string]uint32
	addedByID      map[uint32]int
	rawTrie        *trie // added tokens with normalized=false
	normTrie       *trie // added tokens with normalized=true (patterns normalized)
	encodeSpecial  bool  // split_special_tokens: special tokens are encoded as text

	bos, eos     string
	configTokens map[string]string // bos_token, eos_token, unk_token, pad_token as set in the config
	chatTemplate map[string]string

	segs  *segmentCache
	words *wordCache
}

// Encode returns the ids of text. With addSpecial the post-processor's tokens (a BOS, say) are
// added, as HF's encode(text, add_special_tokens=True) and vLLM's completions path do; chat
// prompts are encoded without them (the template writes its own).
func (t *Tokenizer) Encode(text string, addSpecial bool) []uint32 {
	// Real text averages 3.5–4.5 bytes per token: one allocation covers nearly every prompt.
	return t.AppendEncode(make([]uint32, 0, len(text)/3+8), text, addSpecial)
}

// AppendEncode appends the ids of text to dst (see Encode).
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecial bool) []uint32 {
	if !utf8.ValidString(text) {
		// HF's input is a Rust &str; a Python client's bytes would have been decoded with
		// errors="replace" before reaching it.
		text = strings.ToValidUTF8(text, string(utf8.RuneError))
	}
	if addSpecial && t.post != nil {
		dst = t.post.appendPrefix(dst)
	}
	t.splitAdded(t.rawTrie, text, func(tok, start, end int) {
		if tok >= 0 {
			dst = append(dst, t.added[tok].id)
			return
		}
		dst = t.encodeSegment(dst, piece{s: text[start:end], atStart: start == 0})
	})
	if addSpecial && t.post != nil {
		dst = t.post.appendSuffix(dst)
	}
	return dst
}

// encodeSegment encodes text between raw added tokens, memoized for long segments. A segment's
// ids depend only on its text (and, for Metaspace "first", on whether it starts the input).
func (t *Tokenizer) encodeSegment(dst []uint32, p piece) []uint32 {
	if len(p.s) >= minCachedSegmentBytes {
		if ids, ok := t.segs.get(p.s, p.atStart); ok {
			return append(dst, ids...)
		}
		n := len(dst)
		dst = t.encodeSegmentUncached(dst, p)
		t.segs.put(p.s, p.atStart, dst[n:])
		return dst
	}
	return t.encodeSegmentUncached(dst, p)
}

func (t *Tokenizer) encodeSegmentUncached(dst []uint32, p piece) []uint32 {
	if t.normalizer != nil {
		p.s = t.normalizer.normalize(p.s)
	}
	t.splitAdded(t.normTrie, p.s, func(tok, start, end int) {
		if tok >= 0 {
			dst = append(dst, t.added[tok].id)
			return
		}
		dst = t.encodePiece(dst, piece{s: p.s[start:end], atStart: p.atStart && start == 0})
	})
	return dst
}

// encodePiece pre-tokenizes a normalized piece and runs the model on each word.
func (t *Tokenizer) encodePiece(dst []uint32, p piece) []uint32 {
	if len(t.pre) == 0 {
		return t.encodeWord(dst, p.s)
	}
	sc := scratchPool.Get().(*scratch)
	defer putScratch(sc)
	words, err := t.pre.split(p, nil, sc)
	if err != nil {
		// Only a regex timeout fails, and none is set; keep the ids deterministic anyway.
		return t.encodeWord(dst, p.s)
	}
	for _, w := range words {
		dst = t.encodeWord(dst, w.s)
	}
	return dst
}

func (t *Tokenizer) encodeWord(dst []uint32, w string) []uint32 {
	if t.model.splitMeta && len(w) > maxCachedWordBytes {
		t.model.metaCuts(w, func(part string) { dst = t.encodeCachedWord(dst, part) })
		return dst
	}
	return t.encodeCachedWord(dst, w)
}

func (t *Tokenizer) encodeCachedWord(dst []uint32, w string) []uint32 {
	if len(w) <= maxCachedWordBytes {
		if ids, ok := t.words.get(w); ok {
			return append(dst, ids...)
		}
		n := len(dst)
		dst = t.model.appendTokens(dst, w)
		t.words.put(w, dst[n:])
		return dst
	}
	return t.model.appendTokens(dst, w)
}

// TokenID returns the id of a token given in its vocabulary form (an added token's content, or
// a model token such as "Ġthe").
func (t *Tokenizer) TokenID(tok string) (uint32, bool) {
	if id, ok := t.addedByContent[tok]; ok {
		return id, true
	}
	id, ok := t.model.vocab[tok]
	return id, ok
}

// BOS and EOS are tokenizer_config.json's bos_token and eos_token ("" if unset).
func (t *Tokenizer) BOS() string { return t.bos }

// EOS is tokenizer_config.json's eos_token ("" if unset).
func (t *Tokenizer) EOS() string { return t.eos }

// ConfigTokens returns the special tokens tokenizer_config.json sets (bos_token, eos_token,
// unk_token, pad_token), the variables transformers gives every chat template.
func (t *Tokenizer) ConfigTokens() map[string]string {
	out := make(map[string]string, len(t.configTokens))
	for k, v := range t.configTokens {
		out[k] = v
	}
	return out
}

// ChatTemplate returns the named chat template from tokenizer_config.json ("default" is the
// plain one; "tool_use" exists in some files), or "" if there is none.
func (t *Tokenizer) ChatTemplate(name string) string { return t.chatTemplate[name] }

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id uint32) bool {
	i, ok := t.addedByID[id]
	return ok && t.added[i].special
}

// WithoutSegmentCache returns a copy of t that does not memoize segments (for measurements and
// for callers whose inputs never repeat); it shares the vocabulary and the word cache.
func (t *Tokenizer) WithoutSegmentCache() *Tokenizer {
	c := *t
	c.segs = newSegmentCache(0)
	return &c
}
