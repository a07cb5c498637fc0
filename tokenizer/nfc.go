package tokenizer

import (
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// NFC as Hugging Face's normalizers::NFC computes it: the unicode-normalization-alignments
// crate, that is Unicode 9.0.0 tables and the plain algorithm of UAX #15 (canonical
// decomposition, canonical ordering, canonical composition) with no stream-safe step, so a
// run of more than 30 combining marks gets no U+034F (golang.org/x/text's norm.NFC inserts
// one, and its tables are Unicode 17.0.0).
//
// The per-character data comes from x/text, restricted to the characters assigned in 9.0.0
// (unassigned9): Unicode's normalization stability policy fixes a character's decomposition,
// combining class and composition exclusion once it is assigned, and a later character is to
// 9.0.0 an unassigned code point, which has combining class 0, no decomposition, and composes
// with nothing.

// Hangul syllable arithmetic (The Unicode Standard 9.0.0, section 3.12, "Conjoining Jamo Behavior").
const (
	hangulSBase  = 0xAC00
	hangulLBase  = 0x1100
	hangulVBase  = 0x1161
	hangulTBase  = 0x11A7
	hangulLCount = 19
	hangulVCount = 21
	hangulTCount = 28
	hangulNCount = hangulVCount * hangulTCount
	hangulSCount = hangulLCount * hangulNCount
)

// assigned9 reports whether r was assigned in Unicode 9.0.0.
func assigned9(r rune) bool {
	if r < 0x10000 {
		b := bmpAssigned9()
		return b[r>>6]&(1<<(r&63)) != 0
	}
	return assigned9Search(r)
}

func assigned9Search(r rune) bool {
	// unassigned9 holds [start, end) pairs; find the first start > r.
	n := len(unassigned9) / 2
	i := sort.Search(n, func(i int) bool { return unassigned9[2*i] > r })
	return i == 0 || r >= unassigned9[2*(i-1)+1]
}

// bmpAssigned9 is assigned9 for the BMP as a bitmap (8 KiB), built once.
var bmpAssigned9 = sync.OnceValue(func() *[1024]uint64 {
	var b [1024]uint64
	for r := rune(0); r < 0x10000; r++ {
		if assigned9Search(r) {
			b[r>>6] |= 1 << (r & 63)
		}
	}
	return &b
})

// below0300 reports whether every code point of s is below U+0300 (UTF-8 lead bytes below
// 0xCC): no such character decomposes under NFC or has a non-zero combining class.
func below0300(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0xCC {
			return false
		}
	}
	return true
}

// nfcRune is a character of the decomposed form with its combining class.
type nfcRune struct {
	r   rune
	ccc uint8
}

// cgj is U+034F COMBINING GRAPHEME JOINER, what x/text's stream-safe step inserts.
const cgj = "\u034f"

// nfc9 returns the NFC form of s under Unicode 9.0.0.
func nfc9(s string) string {
	if below0300(s) {
		return s
	}
	// With only characters 9.0.0 has, x/text's NFC is 9.0.0's (stability), unless it inserted a
	// U+034F (it never removes one).
	if allAssigned9(s) {
		out := norm.NFC.String(s) // s itself, without allocating, when s is normal
		if out == s || strings.Count(out, cgj) == strings.Count(s, cgj) {
			return out
		}
		return nfc9Slow(s)
	}
	// A string normal to x/text's newer tables is normal to 9.0.0's: a character 9.0.0 lacks is
	// a starter to it, which only blocks compositions and reorderings, never adds one.
	if norm.NFC.QuickSpanString(s) == len(s) {
		return s
	}
	return nfc9Slow(s)
}

// allAssigned9 reports whether every character of s was assigned in 9.0.0 (all below U+0300 were).
func allAssigned9(s string) bool {
	for i := 0; i < len(s); {
		if s[i] < 0xCC {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if !assigned9(r) {
			return false
		}
		i += n
	}
	return true
}

// nfc9Slow is UAX #15's NFC on 9.0.0's data, without the stream-safe step.
func nfc9Slow(s string) string {
	buf := make([]nfcRune, 0, len(s))
	// 1. Canonical decomposition.
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r >= hangulSBase && r < hangulSBase+hangulSCount:
			si := r - hangulSBase
			buf = append(buf, nfcRune{hangulLBase + si/hangulNCount, 0}, nfcRune{hangulVBase + (si%hangulNCount)/hangulTCount, 0})
			if t := si % hangulTCount; t != 0 {
				buf = append(buf, nfcRune{hangulTBase + t, 0})
			}
		case !assigned9(r):
			buf = append(buf, nfcRune{r, 0})
		default:
			p := norm.NFD.PropertiesString(s[i:])
			d := p.Decomposition()
			if len(d) == 0 {
				buf = append(buf, nfcRune{r, p.CCC()})
				break
			}
			for j := 0; j < len(d); {
				q := norm.NFD.Properties(d[j:])
				dr, dn := utf8.DecodeRune(d[j:])
				buf = append(buf, nfcRune{dr, q.CCC()})
				j += dn
			}
		}
		i += n
	}
	// 2. Canonical ordering: each run of non-starters sorted by combining class, stably.
	for i := 1; i < len(buf); i++ {
		c := buf[i]
		if c.ccc == 0 {
			continue
		}
		j := i
		for j > 0 && buf[j-1].ccc > c.ccc {
			buf[j] = buf[j-1]
			j--
		}
		buf[j] = c
	}
	// 3. Canonical composition: a character composes with the last starter unless a character
	// between them has class 0 or a class >= its own.
	out := buf[:0]
	starter := -1
	last := -1 // class of the last character kept after the starter; -1: none (adjacent)
	for _, c := range buf {
		if starter >= 0 && (last == -1 || (last != 0 && int(c.ccc) > last)) {
			if p, ok := compose9(out[starter].r, c.r); ok {
				out[starter].r = p
				continue
			}
		}
		if c.ccc == 0 {
			starter, last = len(out), -1
		} else {
			last = int(c.ccc)
		}
		out = append(out, c)
	}
	var sb strings.Builder
	sb.Grow(len(s))
	for _, c := range out {
		sb.WriteRune(c.r)
	}
	return sb.String()
}

// compose9 returns the primary composite of a and b under Unicode 9.0.0, if there is one.
func compose9(a, b rune) (rune, bool) {
	// Hangul: L+V and LV+T.
	if a >= hangulLBase && a < hangulLBase+hangulLCount && b >= hangulVBase && b < hangulVBase+hangulVCount {
		return hangulSBase + ((a-hangulLBase)*hangulVCount+(b-hangulVBase))*hangulTCount, true
	}
	if si := a - hangulSBase; si >= 0 && si < hangulSCount && si%hangulTCount == 0 && b > hangulTBase && b < hangulTBase+hangulTCount {
		return a + (b - hangulTBase), true
	}
	if !assigned9(a) || !assigned9(b) {
		return 0, false
	}
	// x/text composes the pair exactly when it has a primary composite that is not excluded;
	// stability keeps both facts as they were in 9.0.0 for characters 9.0.0 has.
	var in [2 * utf8.UTFMax]byte
	n := utf8.EncodeRune(in[:], a)
	n += utf8.EncodeRune(in[n:], b)
	var outb [2 * utf8.UTFMax]byte
	got := norm.NFC.Append(outb[:0], in[:n]...)
	r, size := utf8.DecodeRune(got)
	if size != len(got) || r == a {
		return 0, false
	}
	return r, true
}

// AssignedInUnicode9 reports whether r was assigned in Unicode 9.0.0, the version of Hugging
// Face's NFC tables. A character assigned since then is unassigned to HF's normalizer.
func AssignedInUnicode9(r rune) bool { return assigned9(r) }
