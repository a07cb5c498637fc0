package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"sync"
	"unicode/utf8"
)

// MaxBatchPrompts caps the prompts of one batch: 256 is vLLM's default max_num_seqs, the most
// sequences one engine runs at once, so a bigger batch could not run in one step anywhere and is
// more likely an attack than a workload (each prompt becomes its own routed request).
const MaxBatchPrompts = 256

// MaxPromptTokens caps one prompt at 1 Mi tokens, at every door (the HTTP front door and the
// endpoint picker answer 413, Router.Route InvalidArgument): beyond the context window of every
// model served today, so no engine would run a longer prompt, while each token costs the router
// parsing, hashing and estimating (an 8 MiB body holds 4M one-digit ids: ~0.2 s of router CPU).
// The parser stops at the first id past it; tokenised text is held to it by CheckPromptTokens.
const MaxPromptTokens = 1 << 20

// CodePromptTooLong is the code of a prompt over MaxPromptTokens (413).
const CodePromptTooLong = "prompt_too_long"

// CheckPromptTokens is the prompt token cap: nil for a prompt of n tokens within
// MaxPromptTokens, else the 413 every door answers (Router.Route maps it to InvalidArgument).
func CheckPromptTokens(n int) error {
	if n <= MaxPromptTokens {
		return nil
	}
	return promptTooLong("prompt", n)
}

// promptTooLong is the 413 of a prompt over MaxPromptTokens; n < 0 when the parser stopped
// counting at the first id past the cap.
func promptTooLong(param string, n int) error {
	count := "more than " + strconv.Itoa(MaxPromptTokens)
	if n >= 0 {
		count = strconv.Itoa(n)
	}
	return &Error{Status: http.StatusRequestEntityTooLarge, Code: CodePromptTooLong, Param: param,
		Message: fmt.Sprintf("%s has %s tokens; a prompt may have at most %d", param, count, MaxPromptTokens)}
}

// maxIDValue is the largest token id: ids travel as uint32 everywhere (hashing, the KV cache,
// the wire), and no vocabulary comes near it.
const maxIDValue = math.MaxUint32

// Prompt is a parsed completions prompt. OpenAI's shapes are a string, an array of token ids, an
// array of strings or an array of arrays of token ids; the last two are batches (Batch is true,
// even for a batch of one) and give one Item per element.
type Prompt struct {
	Items []PromptItem
	Batch bool
	// Start and End delimit the prompt's JSON value in the request body (ParseCompletion sets
	// them; the last "prompt" member when the body repeats it, the one that counts): with the
	// items' spans they let a batch be split into single-prompt bodies as views of the body.
	Start, End int
}

// PromptItem is one prompt of a request: text (IDs nil) or token ids.
type PromptItem struct {
	Text string
	IDs  []uint32
	// Start and End delimit the item's JSON in the raw prompt, so a batch can be split into
	// single-prompt bodies without re-encoding.
	Start, End int
}

// IsText reports whether the item is a text prompt.
func (it *PromptItem) IsText() bool { return it.IDs == nil }

// promptParser reads a prompt in one forward pass: every step moves pos forward or ends the parse,
// so the work is linear in the input (steps counts them, for the fuzz test that checks it).
type promptParser struct {
	b          []byte
	pos        int
	steps      int
	lastNumber []byte // the number literal number() read last, for its error message
}

// ParsePrompt parses the JSON value of a completions request's "prompt" field (raw may carry
// surrounding whitespace; empty raw or null means the field is missing). It never nests deeper
// than OpenAI's shapes do: a third level of arrays is refused where it starts, so the cost of a
// hostile input is one pass over it.
func ParsePrompt(raw []byte) (Prompt, error) {
	var p promptParser
	return p.parse(raw)
}

func (p *promptParser) parse(raw []byte) (Prompt, error) {
	out, end, err := p.parseAt(raw, 0)
	if err != nil {
		return Prompt{}, err
	}
	p.pos = end
	p.space()
	if p.pos != len(p.b) {
		return Prompt{}, invalidParam("prompt", "prompt: unexpected %s after the value", p.kind())
	}
	return out, nil
}

// parseAt parses the prompt value starting at b[start] (whitespace allowed before it) and returns
// it with the index after it; item spans are relative to start. The request scanner calls it in
// place of its generic value skipper, so the prompt is read once.
func (p *promptParser) parseAt(b []byte, start int) (Prompt, int, error) {
	p.b, p.pos = b, start
	p.space()
	if p.pos == len(p.b) || p.literal("null") {
		return Prompt{}, p.pos, invalidParam("prompt", "prompt is required")
	}
	var out Prompt
	switch p.b[p.pos] {
	case '"':
		it, err := p.text("prompt")
		if err != nil {
			return Prompt{}, p.pos, err
		}
		out.Items = []PromptItem{it}
	case '[':
		if err := p.array(&out); err != nil {
			return Prompt{}, p.pos, err
		}
	default:
		return Prompt{}, p.pos, invalidParam("prompt", "prompt must be a string, an array of token ids, an array of strings or an array of arrays of token ids; got %s", p.kind())
	}
	for i := range out.Items {
		out.Items[i].Start -= start
		out.Items[i].End -= start
	}
	return out, p.pos, nil
}

// array parses the top-level array: token ids, or a batch of strings or of id arrays, decided by
// the first element.
func (p *promptParser) array(out *Prompt) error {
	start := p.pos
	p.pos++ // '['
	p.space()
	switch {
	case p.pos == len(p.b):
		return invalidParam("prompt", "prompt: unexpected end of JSON")
	case p.at(']'):
		return invalidParam("prompt", "prompt is empty")
	}
	switch p.b[p.pos] {
	case '"', '[':
		out.Batch = true
		return p.batch(out)
	}
	// Token ids: the commas before the array's ']' bound their number, so the slice is
	// allocated once.
	ids := newIDs(idsHint(p.b[p.pos:]))
	ids, err := p.ids(ids, "prompt")
	if err != nil {
		ReleaseIDs(ids)
		return err
	}
	out.Items = []PromptItem{{IDs: ids, Start: start, End: p.pos}}
	return nil
}

// idsHintChunk is how much of an id array idsHint counts commas in at a time: large enough for
// bytes.Count's vector loop to run at full speed, small enough that an oversized array is
// scanned barely past the cap.
const idsHintChunk = 64 << 10

// idsHint is how many ids the id array at rest holds by its commas (those before its ']'),
// counted a chunk at a time and no further than one past MaxPromptTokens: an oversized array
// is not scanned to its end here, nor parsed to its end (ids stops at the cap too).
func idsHint(rest []byte) int {
	n := 1
	for len(rest) > 0 && n <= MaxPromptTokens {
		chunk := rest[:min(len(rest), idsHintChunk)]
		if end := bytes.IndexByte(chunk, ']'); end >= 0 {
			n += bytes.Count(chunk[:end], []byte{','})
			break
		}
		n += bytes.Count(chunk, []byte{','})
		rest = rest[len(chunk):]
	}
	return min(n, MaxPromptTokens+1)
}

// batch parses the elements of a batch: all strings or all arrays of token ids.
func (p *promptParser) batch(out *Prompt) error {
	text := p.b[p.pos] == '"'
	for i := 0; ; i++ {
		p.steps++
		p.space()
		if i == MaxBatchPrompts {
			return invalidParam("prompt", "prompt: a batch holds at most %d prompts", MaxBatchPrompts)
		}
		param := "prompt[" + strconv.Itoa(i) + "]"
		if p.pos == len(p.b) {
			return invalidParam("prompt", "prompt: unexpected end of JSON")
		}
		var it PromptItem
		switch c := p.b[p.pos]; {
		case text && c == '"':
			var err error
			if it, err = p.text(param); err != nil {
				return err
			}
		case !text && c == '[':
			it.Start = p.pos
			p.pos++
			p.space()
			if p.at(']') {
				return invalidParam(param, "%s is empty", param)
			}
			var err error
			if it.IDs, err = p.ids(nil, param); err != nil {
				return err
			}
			it.End = p.pos
		case text:
			return invalidParam(param, "%s: a batch of text prompts holds only strings; got %s", param, p.kind())
		default:
			return invalidParam(param, "%s: a batch of token-id prompts holds only arrays of token ids; got %s", param, p.kind())
		}
		out.Items = append(out.Items, it)
		p.space()
		switch {
		case p.at(']'):
			p.pos++
			return nil
		case p.at(','):
			p.pos++
		default:
			return invalidParam("prompt", "prompt: expected ',' or ']' after %s, got %s", param, p.kind())
		}
	}
}

// ids parses token ids after an array's '[' (at least one, whitespace skipped) through its ']',
// and stops with a 413 at the first id past MaxPromptTokens (ids are returned then, for
// ReleaseIDs).
func (p *promptParser) ids(ids []uint32, param string) ([]uint32, error) {
	base := len(ids)
	ids, err := p.idsUpTo(ids, param)
	if err == nil && len(ids)-base > MaxPromptTokens {
		err = promptTooLong(param, -1)
	}
	return ids, err
}

// idsUpTo is ids without the final check: it stops at the first id past the cap, and ids tells
// that from a complete array.
func (p *promptParser) idsUpTo(ids []uint32, param string) ([]uint32, error) {
	limit := len(ids) + MaxPromptTokens
	for i := 0; ; i++ {
		if len(ids) > limit {
			return ids, nil
		}
		// Fastest path, the common case: ids of up to 7 plain digits, each directly followed by
		// ',' (or Python's ", ") or ']', read 8 bytes at a time (swarDigits), the parser's
		// position in locals until the run ends, the separator read from the same word.
		start, base := p.pos, len(ids)-i
		var j int
		var end bool
		ids, j, end = plainIDs(p.b, p.pos, ids, limit)
		p.pos, p.steps, i = j, p.steps+j-start, len(ids)-base // a step per byte, as below
		if end || len(ids) > limit {
			return ids, nil
		}
		// Fast path: plain digits directly followed by ',' or ']'.
		if b, j := p.b, p.pos; j < len(b) && b[j] >= '1' && b[j] <= '9' {
			var v uint64
			k := j
			for k < len(b) && k-j < 11 {
				d := b[k] - '0'
				if d > 9 {
					break
				}
				v = v*10 + uint64(d)
				k++
			}
			if k < len(b) && v <= maxIDValue && (b[k] == ',' || b[k] == ']') {
				p.steps += k - j + 1
				ids = append(ids, uint32(v))
				p.pos = k + 1
				if b[k] == ']' {
					return ids, nil
				}
				continue
			}
		}
		p.steps++
		p.space()
		if p.pos == len(p.b) {
			return nil, invalidParam(param, "%s: unexpected end of JSON", param)
		}
		if c := p.b[p.pos]; c != '-' && (c < '0' || c > '9') {
			what := p.kind()
			if c == '[' {
				what = "an array (prompts nest at most two levels: a batch of arrays of token ids)"
			}
			return nil, invalidParam(param, "%s[%d]: expected a token id (an integer in 0..%d), got %s", param, i, uint32(maxIDValue), what)
		}
		v, ok := p.number()
		if !ok {
			return nil, invalidParam(param, "%s[%d]: %s is not a token id (an integer in 0..%d)", param, i, p.lastNumber, uint32(maxIDValue))
		}
		ids = append(ids, v)
		p.space()
		switch {
		case p.at(']'):
			p.pos++
			return ids, nil
		case p.at(','):
			p.pos++
		default:
			return nil, invalidParam(param, "%s: expected ',' or ']' after element %d, got %s", param, i, p.kind())
		}
	}
}

// plainIDs appends the ids at b[j:] while they are plain (up to 7 digits, not led by 0, each
// directly followed by ',' or ']', or by Python's ", "), read 8 bytes at a time (swarDigits' steps) with
// the separator taken from the same word, and returns where it stopped and whether that is after
// the array's ']', stopping once ids holds more than limit or is full (the caller's slow path
// appends, which grows it). It writes ids by index into their capacity (idsHint sized it): the
// ids followed by a separator go four at a time (idRounds, or idRoundsPy once the separator is
// ", "), the rest one at a time.
func plainIDs(b []byte, j int, ids []uint32, limit int) ([]uint32, int, bool) {
	if j < 0 || len(ids) > limit {
		return ids, j, false
	}
	n0 := len(ids)
	out := ids[n0:cap(ids)]
	out = out[:min(len(out), limit+1-n0)] // ids may end holding limit+1, as with append
	j, k := idRounds(b, j, out, 0)
	if j > 0 && j < len(b) && b[j-1] == ',' && b[j] == ' ' { // Python's ", "
		j, k = idRoundsPy(b, j+1, out, k)
	}
	for ; k < len(out) && j <= len(b)-8; k++ {
		w := load64(b, j)
		t := w ^ 0x3030303030303030 // a digit byte becomes its value 0..9
		if byte(t)-1 > 8 {          // the first byte is not '1'..'9'
			if byte(w) == ' ' && j > 0 && b[j-1] == ',' { // Python's ", "
				j++
				k--
				continue
			}
			break
		}
		s := runBits(t)
		sep := byte(w >> s)
		if sep != ',' && sep != ']' {
			break
		}
		out[k] = swarValue8(t, s)
		j += int(s>>3) + 1
		if sep == ']' {
			return ids[:n0+k+1], j, true
		}
	}
	return ids[:n0+k], j, false
}

// idRounds reads ids each followed by ',' into out from k, four a round while four places are
// left and b holds a window of roundWindow bytes at j, and returns where it stopped (at the
// first id that is not plain or not followed by ','). A round reads its window at offsets the
// compiler can bound (an id and its separator take at most 8 bytes), so nothing in it is
// checked again; unrolled, because the same steps as a loop of four cost about a quarter
// more instructions (BenchmarkParseCompletionIDs under callgrind).
func idRounds(b []byte, j int, out []uint32, k int) (int, int) {
	for k+4 <= len(out) && j >= 0 && j <= len(b)-roundWindow {
		win, dst := (*[roundWindow]byte)(b[j:j+roundWindow]), out[k:k+4:k+4]
		o := uint(0) // o ≤ 24 before an id: o&31 is o
		w0 := load64(win[o&31:], 0)
		t0 := w0 ^ 0x3030303030303030
		s0 := runBits(t0)
		if byte(t0)-1 > 8 || byte(w0>>s0) != ',' {
			return j, k
		}
		dst[0], k, j, o = swarValue8(t0, s0), k+1, j+int(s0>>3)+1, o+s0>>3+1
		w1 := load64(win[o&31:], 0)
		t1 := w1 ^ 0x3030303030303030
		s1 := runBits(t1)
		if byte(t1)-1 > 8 || byte(w1>>s1) != ',' {
			return j, k
		}
		dst[1], k, j, o = swarValue8(t1, s1), k+1, j+int(s1>>3)+1, o+s1>>3+1
		w2 := load64(win[o&31:], 0)
		t2 := w2 ^ 0x3030303030303030
		s2 := runBits(t2)
		if byte(t2)-1 > 8 || byte(w2>>s2) != ',' {
			return j, k
		}
		dst[2], k, j, o = swarValue8(t2, s2), k+1, j+int(s2>>3)+1, o+s2>>3+1
		w3 := load64(win[o&31:], 0)
		t3 := w3 ^ 0x3030303030303030
		s3 := runBits(t3)
		if byte(t3)-1 > 8 || byte(w3>>s3) != ',' {
			return j, k
		}
		dst[3], k, j, o = swarValue8(t3, s3), k+1, j+int(s3>>3)+1, o+s3>>3+1
	}
	return j, k
}

// idRoundsPy is idRounds for ids each followed by Python's ", " (json.dumps' separator), which
// a run of 7 digits leaves no room for in its word: such an id ends the rounds.
func idRoundsPy(b []byte, j int, out []uint32, k int) (int, int) {
	for k+4 <= len(out) && j >= 0 && j <= len(b)-roundWindow {
		win, dst := (*[roundWindow]byte)(b[j:j+roundWindow]), out[k:k+4:k+4]
		o := uint(0) // o ≤ 24 before an id: o&31 is o
		w0 := load64(win[o&31:], 0)
		t0 := w0 ^ 0x3030303030303030
		s0 := runBits(t0)
		if byte(t0)-1 > 8 || uint16(w0>>s0) != ','|' '<<8 {
			return j, k
		}
		dst[0], k, j, o = swarValue8(t0, s0), k+1, j+int(s0>>3)+2, o+s0>>3+2
		w1 := load64(win[o&31:], 0)
		t1 := w1 ^ 0x3030303030303030
		s1 := runBits(t1)
		if byte(t1)-1 > 8 || uint16(w1>>s1) != ','|' '<<8 {
			return j, k
		}
		dst[1], k, j, o = swarValue8(t1, s1), k+1, j+int(s1>>3)+2, o+s1>>3+2
		w2 := load64(win[o&31:], 0)
		t2 := w2 ^ 0x3030303030303030
		s2 := runBits(t2)
		if byte(t2)-1 > 8 || uint16(w2>>s2) != ','|' '<<8 {
			return j, k
		}
		dst[2], k, j, o = swarValue8(t2, s2), k+1, j+int(s2>>3)+2, o+s2>>3+2
		w3 := load64(win[o&31:], 0)
		t3 := w3 ^ 0x3030303030303030
		s3 := runBits(t3)
		if byte(t3)-1 > 8 || uint16(w3>>s3) != ','|' '<<8 {
			return j, k
		}
		dst[3], k, j, o = swarValue8(t3, s3), k+1, j+int(s3>>3)+2, o+s3>>3+2
	}
	return j, k
}

// roundWindow is the input a round of idRounds reads from: the compiler's bound on the offset
// of its last id (o&31 ≤ 31) and that id's word.
const roundWindow = 32 + 8

// runBits is eight times the length of the run of digits at the start of the word t (the input
// with '0' taken from each byte), 8..56 when t starts with a digit: a run of 8 counts as 7
// followed by a digit, which is no separator (digitRun7).
func runBits(t uint64) uint {
	return uint(bits.TrailingZeros64((t|(t+0x0606060606060606))&0xF0F0F0F0F0F0F0F0|1<<63)) &^ 7
}

// swarValue8 is swarValue for t, the input word with '0' taken from each byte, and s, eight times
// the number of digits (8..56).
func swarValue8(t uint64, s uint) uint32 {
	t <<= (64 - s) & 63 // the digits in the top bytes, zeros (leading zeros) below
	t = t*10 + t>>8     // pairs of digits
	t = ((t&0x000000FF000000FF)*(100+1000000<<32) + (t>>16&0x000000FF000000FF)*(1+10000<<32)) >> 32
	return uint32(t)
}

// load64 is the 8 bytes at b[j:], little-endian: one load, without the slice that
// binary.LittleEndian.Uint64(b[j:]) builds (and masks) per call.
func load64(b []byte, j int) uint64 {
	b = b[j : j+8 : j+8]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// swarDigits reads the run of ASCII digits at the start of w (8 bytes of the input, the first in
// the lowest byte) with a few word operations instead of a multiply per digit: n is the run's
// length (8 when all eight bytes are digits, and then v is not computed) and v its value. The
// digit test and the pairwise combination are the SWAR technique of simdjson's
// parse_eight_digits_unrolled (Lemire and Langdale, "Parsing Gigabytes of JSON per Second",
// VLDB Journal 2019).
func swarDigits(w uint64) (v uint32, n int) {
	n = digitRun(w)
	if n == 0 || n == 8 {
		return 0, n
	}
	return swarValue(w, n), n
}

// digitRun is the length of the run of ASCII digits at the start of w (8 when all are).
func digitRun(w uint64) int {
	t := w ^ 0x3030303030303030 // a digit byte becomes its value 0..9
	// A byte is not a digit when its high nibble is set or it is 10..15; a carry out of a
	// non-digit byte can only spoil later bytes, past the first non-digit, which is all we read.
	nonDigit := (t & 0xF0F0F0F0F0F0F0F0) | ((t + 0x0606060606060606) & 0xF0F0F0F0F0F0F0F0)
	return bits.TrailingZeros64(nonDigit) >> 3
}

// digitRun7 is digitRun capped at 7 (7 when all eight bytes are digits), without the branch on
// an all-digit word.
func digitRun7(w uint64) int {
	t := w ^ 0x3030303030303030
	nonDigit := (t & 0xF0F0F0F0F0F0F0F0) | ((t + 0x0606060606060606) & 0xF0F0F0F0F0F0F0F0)
	return bits.TrailingZeros64(nonDigit|1<<63) >> 3
}

// swarValue is the value of the n (1..7) digits at the start of w.
func swarValue(w uint64, n int) uint32 {
	t := (w ^ 0x3030303030303030) << (64 - 8*uint(n)) // the digits in the top n bytes, zeros (leading zeros) below
	t = t*10 + t>>8                                   // pairs of digits
	t = ((t&0x000000FF000000FF)*(100+1000000<<32) + (t>>16&0x000000FF000000FF)*(1+10000<<32)) >> 32
	return uint32(t)
}

// number parses a JSON number at pos and reports whether it is a token id: an integer value in
// range, written plainly (the fast path) or with a fraction or exponent whose value is integral
// (1.0, 1e3: what Python's json writes for floats; vLLM's pydantic accepts them as ints).
func (p *promptParser) number() (uint32, bool) {
	start := p.pos
	var v uint64
	plain := true
	if p.b[p.pos] == '-' {
		plain = false
		p.pos++
	}
	digits := p.pos
	for p.pos < len(p.b) && p.b[p.pos] >= '0' && p.b[p.pos] <= '9' {
		p.steps++
		if v <= maxIDValue {
			v = v*10 + uint64(p.b[p.pos]-'0')
		}
		p.pos++
	}
	if p.pos == digits || (p.b[digits] == '0' && p.pos-digits > 1) {
		p.lastNumber = p.b[start:min(p.pos+1, len(p.b))]
		return 0, false // no digits, or a leading zero: not JSON
	}
	if p.at('.') {
		plain = false
		p.pos++
		f := p.pos
		p.digits()
		if p.pos == f {
			p.lastNumber = p.b[start:p.pos]
			return 0, false
		}
	}
	if p.at('e') || p.at('E') {
		plain = false
		p.pos++
		if p.at('+') || p.at('-') {
			p.pos++
		}
		f := p.pos
		p.digits()
		if p.pos == f {
			p.lastNumber = p.b[start:p.pos]
			return 0, false
		}
	}
	p.lastNumber = p.b[start:p.pos]
	if plain {
		return uint32(v), v <= maxIDValue
	}
	// The literal is at most the body long and ParseFloat is linear in it.
	f, err := strconv.ParseFloat(string(p.lastNumber), 64)
	if err != nil || f < 0 || f > maxIDValue || f != math.Trunc(f) {
		return 0, false
	}
	return uint32(f), true
}

func (p *promptParser) digits() {
	for p.pos < len(p.b) && p.b[p.pos] >= '0' && p.b[p.pos] <= '9' {
		p.steps++
		p.pos++
	}
}

// text parses a JSON string at pos (a non-empty prompt).
func (p *promptParser) text(param string) (PromptItem, error) {
	start := p.pos
	p.pos++ // '"'
	simple := true
	for {
		p.steps++
		if p.pos >= len(p.b) {
			return PromptItem{}, invalidParam(param, "%s: unterminated string", param)
		}
		c := p.b[p.pos]
		if c == '"' {
			break
		}
		if c < 0x20 {
			return PromptItem{}, invalidParam(param, "%s: control character in string (escape it)", param)
		}
		if c == '\\' {
			simple = false
			p.pos++ // the escaped byte, checked by the decoder below
		} else if c >= utf8.RuneSelf {
			simple = false
		}
		p.pos++
	}
	p.pos++ // '"'
	span := p.b[start:p.pos]
	it := PromptItem{Start: start, End: p.pos}
	if simple {
		it.Text = string(span[1 : len(span)-1])
	} else if err := json.Unmarshal(span, &it.Text); err != nil { // linear in the span
		return PromptItem{}, invalidParam(param, "%s: invalid string: %v", param, err)
	}
	if it.Text == "" {
		return PromptItem{}, invalidParam(param, "%s is empty", param)
	}
	return it, nil
}

// space skips JSON whitespace.
func (p *promptParser) space() {
	for p.pos < len(p.b) {
		switch p.b[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.steps++
			p.pos++
		default:
			return
		}
	}
}

func (p *promptParser) at(c byte) bool { return p.pos < len(p.b) && p.b[p.pos] == c }

func (p *promptParser) literal(s string) bool {
	if bytes.HasPrefix(p.b[p.pos:], []byte(s)) {
		p.pos += len(s)
		return true
	}
	return false
}

// kind names the JSON value at pos, for error messages.
func (p *promptParser) kind() string {
	if p.pos >= len(p.b) {
		return "the end of the JSON"
	}
	switch c := p.b[p.pos]; {
	case c == '"':
		return "a string"
	case c == '[':
		return "an array"
	case c == '{':
		return "an object"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	case c == '-' || (c >= '0' && c <= '9'):
		return "a number"
	}
	return strconv.Quote(string(p.b[p.pos : p.pos+1]))
}

// ParseIDs parses a JSON array of token ids (a field such as /detokenize's "tokens"), with the
// prompt parser's rules: at least one id, no nulls, each an integer in 0..2^32-1.
func ParseIDs(raw []byte, param string) ([]uint32, error) {
	p := promptParser{b: raw}
	p.space()
	switch {
	case p.pos == len(p.b) || p.literal("null"):
		return nil, invalidParam(param, "%s is required", param)
	case !p.at('['):
		return nil, invalidParam(param, "%s must be an array of token ids, got %s", param, p.kind())
	}
	p.pos++
	p.space()
	if p.at(']') {
		return nil, invalidParam(param, "%s is empty", param)
	}
	ids, err := p.ids(make([]uint32, 0, idsHint(raw[p.pos:])), param)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.pos != len(p.b) {
		return nil, invalidParam(param, "%s: unexpected %s after the value", param, p.kind())
	}
	return ids, nil
}

// Token-id slices of single-prompt requests come from pools, one per power-of-two capacity, for
// callers that hand them back when done (ReleaseIDs: the front door, which would otherwise
// allocate 32 KB per 8k-token request); a caller that never does only loses the reuse.
const (
	minPooledIDBits = 8  // 256 ids: 1 KiB
	maxPooledIDBits = 17 // 128k ids: 512 KiB; longer prompts are allocated per request
)

var idPools [maxPooledIDBits - minPooledIDBits + 1]sync.Pool // of *[]uint32

func idClass(n int) int {
	c := max(bits.Len(uint(n-1)), minPooledIDBits) - minPooledIDBits
	if c >= len(idPools) {
		return -1
	}
	return c
}

// newIDs is an empty slice with room for n ids.
func newIDs(n int) []uint32 {
	c := idClass(n)
	if c < 0 {
		return make([]uint32, 0, n)
	}
	if p, _ := idPools[c].Get().(*[]uint32); p != nil {
		return (*p)[:0]
	}
	return make([]uint32, 0, 1<<(c+minPooledIDBits))
}

// ReleaseIDs hands back the IDs of a parsed prompt item once nothing reads them any more: the
// next parse may overwrite them. Slices not of a pooled capacity are left to the collector.
func ReleaseIDs(ids []uint32) {
	c := idClass(cap(ids))
	if cap(ids) == 0 || c < 0 || cap(ids) != 1<<(c+minPooledIDBits) {
		return
	}
	ids = ids[:0]
	idPools[c].Put(&ids)
}
