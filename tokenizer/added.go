package tokenizer

import (
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	id                                     uint32
	content                                string
	singleWord, lstrip, rstrip, normalized bool
	special                                bool
}

// trie is a byte trie of added tokens for leftmost-longest matching (what HF's Aho-Corasick
// with MatchKind::LeftmostLongest finds): scanning left to right, the first position where some
// token starts wins, and there the longest token.
type trie struct {
	nodes []trieNode
	first [256]bool // bytes some token starts with: skip everything else fast
	// only is the single byte every token starts with ('<' in most files), or -1: then the
	// scan is strings.IndexByte.
	only  int
	empty bool
}

type trieNode struct {
	next map[byte]int32
	tok  int32 // index into Tokenizer.added, -1 if no token ends here
}

func newTrie() *trie { return &trie{nodes: []trieNode{{tok: -1}}, empty: true, only: -1} }

func (t *trie) insert(s string, tok int) {
	n := int32(0)
	for i := 0; i < len(s); i++ {
		nd := &t.nodes[n]
		if nd.next == nil {
			nd.next = map[byte]int32{}
		}
		c, ok := nd.next[s[i]]
		if !ok {
			c = int32(len(t.nodes))
			nd.next[s[i]] = c
			t.nodes = append(t.nodes, trieNode{tok: -1})
		}
		n = c
	}
	if t.nodes[n].tok < 0 { // the first of duplicate contents wins, as in HF's pattern order
		t.nodes[n].tok = int32(tok)
	}
	switch {
	case t.empty:
		t.only = int(s[0])
	case t.only != int(s[0]):
		t.only = -1
	}
	t.first[s[0]] = true
	t.empty = false
}

// longestAt returns the token index and length of the longest token starting at s[i:], or -1.
func (t *trie) longestAt(s string, i int) (int, int) {
	best, bestLen := -1, 0
	n := int32(0)
	for j := i; j < len(s); j++ {
		c, ok := t.nodes[n].next[s[j]]
		if !ok {
			break
		}
		n = c
		if tk := t.nodes[n].tok; tk >= 0 {
			best, bestLen = int(tk), j+1-i
		}
	}
	return best, bestLen
}

// next finds the leftmost-longest match at or after from.
func (t *trie) next(s string, from int) (tok, start, end int) {
	if t.empty {
		return -1, 0, 0
	}
	if t.only >= 0 {
		for i := from; i < len(s); {
			j := strings.IndexByte(s[i:], byte(t.only))
			if j < 0 {
				break
			}
			i += j
			if tk, n := t.longestAt(s, i); tk >= 0 {
				return tk, i, i + n
			}
			i++
		}
		return -1, 0, 0
	}
	for i := from; i < len(s); i++ {
		if !t.first[s[i]] {
			continue
		}
		if tk, n := t.longestAt(s, i); tk >= 0 {
			return tk, i, i + n
		}
	}
	return -1, 0, 0
}

// splitAdded is HF's AddedVocabulary::find_matches: cut s into text spans (id -1) and added-token
// spans, honouring single_word, lstrip and rstrip. fn is called for each span in order.
func (tk *Tokenizer) splitAdded(t *trie, s string, fn func(tok int, start, end int)) {
	startOff := 0
	for from := 0; from < len(s); {
		ti, start, stop := t.next(s, from)
		if ti < 0 {
			break
		}
		from = stop
		a := &tk.added[ti]
		if tk.encodeSpecial && a.special {
			continue
		}
		if a.singleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if a.lstrip {
			start = max(leftmostSpaceAtEnd(s[:start]), startOff)
		}
		if a.rstrip {
			stop += rightmostSpaceAtStart(s[stop:])
		}
		if startOff < start {
			fn(-1, startOff, start)
		}
		fn(ti, start, stop)
		startOff = stop // the search goes on from the match's own end, as Aho-Corasick's does
	}
	if startOff < len(s) {
		fn(-1, startOff, len(s))
	}
}

// isWordRune is Rust regex's Unicode \w: letters, marks, digits (Nd), connector punctuation.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.Is(unicode.M, r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r) ||
		unicode.Is(unicode.Join_Control, r)
}

// isSpaceRune is Rust regex's Unicode \s (White_Space).
func isSpaceRune(r rune) bool { return unicode.Is(unicode.White_Space, r) }

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordRune(r)
}

func leftmostSpaceAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !isSpaceRune(r) {
			break
		}
		i -= n
	}
	return i
}

func rightmostSpaceAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !isSpaceRune(r) {
			break
		}
		i += n
	}
	return i
}

// setAdded indexes the added tokens: the non-normalized ones match the raw text, the normalized
// ones the normalized pieces (HF's two tries). Special tokens come first, as in HF.
func (tk *Tokenizer) setAdded(list []addedTokenJSON) error {
	tk.addedByContent = map[string]uint32{}
	tk.addedByID = map[uint32]int{}
	ordered := make([]addedTokenJSON, len(list))
	copy(ordered, list)
	sort.SliceStable(ordered, func(i, j int) bool { return ordered[i].Special && !ordered[j].Special })
	tk.rawTrie, tk.normTrie = newTrie(), newTrie()
	for _, a := range ordered {
		if a.Content == "" {
			continue
		}
		if _, dup := tk.addedByContent[a.Content]; dup {
			continue
		}
		i := len(tk.added)
		tk.added = append(tk.added, addedToken{id: a.ID, content: a.Content, singleWord: a.SingleWord,
			lstrip: a.LStrip, rstrip: a.RStrip, normalized: a.Normalized, special: a.Special})
		tk.addedByContent[a.Content] = a.ID
		tk.addedByID[a.ID] = i
		if !a.Normalized {
			tk.rawTrie.insert(a.Content, i)
			continue
		}
		pat := a.Content
		if tk.normalizer != nil {
			pat = tk.normalizer.normalize(pat)
		}
		if pat == "" {
			return fmt.Errorf("token %q normalizes to nothing", a.Content)
		}
		tk.normTrie.insert(pat, i)
	}
	return nil
}
