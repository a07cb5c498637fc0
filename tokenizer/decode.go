package tokenizer

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// decoder turns a list of token strings into text, as HF's decode_chain does.
type decoder interface {
	decodeChain(toks []string) []string
}

type byteLevelDec struct{}

func (byteLevelDec) decodeChain(toks []string) []string {
	var buf []byte
	for _, t := range toks {
		for _, r := range t {
			if b, ok := runeToByte[r]; ok {
				buf = append(buf, byte(b))
			} else {
				buf = utf8.AppendRune(buf, r)
			}
		}
	}
	return []string{strings.ToValidUTF8(string(buf), string(utf8.RuneError))}
}

type replaceDec struct{ from, to string }

func (d replaceDec) decodeChain(toks []string) []string {
	for i, t := range toks {
		toks[i] = strings.ReplaceAll(t, d.from, d.to)
	}
	return toks
}

// byteFallbackDec turns runs of <0xHH> tokens into their bytes (U+FFFD per byte if invalid).
type byteFallbackDec struct{}

func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	var b byte
	for _, c := range t[3:5] {
		b <<= 4
		switch {
		case c >= '0' && c <= '9':
			b |= byte(c - '0')
		case c >= 'A' && c <= 'F':
			b |= byte(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return b, true
}

func (byteFallbackDec) decodeChain(toks []string) []string {
	out := toks[:0:0]
	var pend []byte
	flush := func() {
		if len(pend) == 0 {
			return
		}
		if utf8.Valid(pend) {
			out = append(out, string(pend))
		} else {
			for range pend {
				out = append(out, string(utf8.RuneError))
			}
		}
		pend = pend[:0]
	}
	for _, t := range toks {
		if b, ok := parseByteToken(t); ok {
			pend = append(pend, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDec struct{}

func (fuseDec) decodeChain(toks []string) []string { return []string{strings.Join(toks, "")} }

type stripDec struct {
	content     string
	start, stop int
}

func (d stripDec) decodeChain(toks []string) []string {
	for i, t := range toks {
		for n := 0; n < d.start && strings.HasPrefix(t, d.content); n++ {
			t = t[len(d.content):]
		}
		for n := 0; n < d.stop && strings.HasSuffix(t, d.content); n++ {
			t = t[:len(t)-len(d.content)]
		}
		toks[i] = t
	}
	return toks
}

type metaspaceDec struct {
	repl    string
	prepend bool
}

func (d metaspaceDec) decodeChain(toks []string) []string {
	for i, t := range toks {
		if i == 0 && d.prepend {
			// HF drops every replacement character of the first token, not just a leading one.
			toks[i] = strings.ReplaceAll(t, d.repl, "")
			continue
		}
		toks[i] = strings.ReplaceAll(t, d.repl, " ")
	}
	return toks
}

type decSeq []decoder

func (q decSeq) decodeChain(toks []string) []string {
	for _, d := range q {
		toks = d.decodeChain(toks)
	}
	return toks
}

func parseDecoder(raw json.RawMessage) (decoder, error) {
	typ, err := typed(raw)
	if err != nil || typ == "" {
		return nil, err
	}
	switch typ {
	case "ByteLevel":
		return byteLevelDec{}, nil
	case "ByteFallback":
		return byteFallbackDec{}, nil
	case "Fuse":
		return fuseDec{}, nil
	case "Replace":
		var p struct {
			Pattern patternJSON `json:"pattern"`
			Content string      `json:"content"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		if p.Pattern.String == nil || *p.Pattern.String == "" {
			return nil, unsupported("Replace decoder without a literal pattern")
		}
		return replaceDec{*p.Pattern.String, p.Content}, nil
	case "Strip":
		var p struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		return stripDec{p.Content, p.Start, p.Stop}, nil
	case "Metaspace":
		var p struct {
			Replacement   string  `json:"replacement"`
			PrependScheme *string `json:"prepend_scheme"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		return metaspaceDec{p.Replacement, p.PrependScheme == nil || *p.PrependScheme != "never"}, nil
	case "Sequence":
		q, err := parseSequence(raw, "decoders", parseDecoder)
		if err != nil {
			return nil, err
		}
		return decSeq(q), nil
	}
	return nil, unsupported("decoder %q", typ)
}

// Decode returns the text of ids, as HF's decode(ids, skip_special_tokens): ids the vocabulary
// does not know are dropped (as HF does), special added tokens are dropped if skipSpecial.
func (t *Tokenizer) Decode(ids []uint32, skipSpecial bool) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if i, ok := t.addedByID[id]; ok {
			if skipSpecial && t.added[i].special {
				continue
			}
			toks = append(toks, t.added[i].content)
			continue
		}
		if s, ok := t.model.tokens[id]; ok {
			toks = append(toks, s)
		}
	}
	if t.decoder == nil {
		return strings.Join(toks, " ")
	}
	return strings.Join(t.decoder.decodeChain(toks), "")
}

// Known reports whether id is in the vocabulary (model or added tokens).
func (t *Tokenizer) Known(id uint32) bool {
	if _, ok := t.addedByID[id]; ok {
		return true
	}
	_, ok := t.model.tokens[id]
	return ok
}
