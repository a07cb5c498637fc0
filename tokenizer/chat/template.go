// Package chat renders a model's Jinja chat template for an OpenAI chat request exactly as vLLM
// does with Hugging Face transformers: vLLM's message rewriting (text parts joined with "\n",
// tool-call arguments parsed as json.loads does, tools as vLLM dumps them), transformers'
// template environment (trim_blocks, lstrip_blocks, tojson as json.dumps(ensure_ascii=False),
// raise_exception, strftime_now) on github.com/ardanlabs/jinja with values printed as Python
// prints them (rewrite.go, python.go), continue_final_message, and then the model's tokenizer
// with add_special_tokens off unless the request turns it on. Templates and requests that
// cannot be rendered exactly are refused with an error naming why (Reason labels it).
package chat

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"

	"github.com/prefixmesh/prefixmesh/tokenizer"
)

// Template is a compiled chat template with its tokenizer. Safe for concurrent use.
type Template struct {
	tok     *tokenizer.Tokenizer
	byName  map[string]*compiled
	special map[string]jinja.Value // bos_token, eos_token …
	now     func() time.Time
	// parts: the template loops over message content, so vLLM gives it content as a list of
	// parts (its "openai" content format) instead of a string.
	parts bool
}

// compiled is one named template, rewritten (rewrite.go) and compiled.
type compiled struct {
	t     *jinja.Template
	feats templateFeatures
}

// contentLoop detects templates that iterate over message content, for which vLLM's "auto"
// content format picks "openai" (content stays a list of parts). vLLM walks the template's AST
// for a for-loop over message['content']; this matches the same loops in the source.
var contentLoop = regexp.MustCompile(`for\s+\w+\s+in\s+\w+\s*(\.content|\[\s*['"]content['"]\s*\])`)

// Refusals: a template or request the Go path cannot render exactly. Each wraps
// tokenizer.ErrUnsupported; Reason names them for metrics.
var (
	// ErrNoTemplate is returned by New for a tokenizer without a chat template.
	ErrNoTemplate = fmt.Errorf("%w: the tokenizer has no chat template", tokenizer.ErrUnsupported)
	// ErrTemplateFeature: the template uses something the Go engine does not render exactly
	// (the {% generation %} tag, a syntax it does not parse …).
	ErrTemplateFeature = fmt.Errorf("%w: chat template", tokenizer.ErrUnsupported)
	// ErrNumberFormat: the request has a number (such as 1.0, 1234567.5 or an integer beyond
	// int64) and the template formats values outside tojson and {{ … }} (through ~, join,
	// format, '%s' % …), where the Go engine prints numbers differently from Python.
	ErrNumberFormat = fmt.Errorf("%w: a number the template formats outside tojson and {{ }}, where Go and Python print it differently", tokenizer.ErrUnsupported)
	// ErrBigInteger: an integer beyond int64 that the template inspects as a number ("is
	// integer", | int …) or that shares its float value with another number of the request.
	ErrBigInteger = fmt.Errorf("%w: an integer beyond 64 bits that the template inspects as a number", tokenizer.ErrUnsupported)
	// ErrPythonWhitespace: the request holds U+001C–U+001F and the template calls
	// str.strip()/split()/splitlines(), whose whitespace and line breaks differ in Go.
	ErrPythonWhitespace = fmt.Errorf("%w: U+001C–U+001F in a request whose template strips or splits on Python's whitespace", tokenizer.ErrUnsupported)
	// ErrPythonRepr: the template prints a container holding a character whose Python repr
	// depends on the Python version's Unicode tables.
	ErrPythonRepr = fmt.Errorf("%w: a list or dict printed with Python's repr that cannot be reproduced exactly", tokenizer.ErrUnsupported)
)

// Reason returns a short label for why err refuses exact tokenization (for metrics), or ""
// when err is not such a refusal.
func Reason(err error) string {
	switch {
	case err == nil || !errors.Is(err, tokenizer.ErrUnsupported):
		return ""
	case errors.Is(err, ErrNoTemplate):
		return "no_chat_template"
	case errors.Is(err, ErrTemplateFeature):
		return "template_feature"
	case errors.Is(err, ErrNumberFormat):
		return "number_format"
	case errors.Is(err, ErrBigInteger):
		return "big_integer"
	case errors.Is(err, ErrPythonWhitespace):
		return "python_whitespace"
	case errors.Is(err, ErrPythonRepr):
		return "python_repr"
	}
	return "tokenizer_feature"
}

// New compiles the tokenizer's chat templates (tokenizer_config.json's chat_template).
func New(tok *tokenizer.Tokenizer) (*Template, error) {
	t := &Template{tok: tok, byName: map[string]*compiled{}, now: time.Now, special: map[string]jinja.Value{}}
	for _, name := range []string{"default", "tool_use"} {
		src := tok.ChatTemplate(name)
		if src == "" {
			continue
		}
		if err := checkTemplate(src); err != nil {
			return nil, fmt.Errorf("chat template %q: %w", name, err)
		}
		t.parts = t.parts || contentLoop.MatchString(src)
		rw, feats, err := rewriteTemplate(src)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", ErrTemplateFeature, name, err)
		}
		c, err := jinja.Compile(rw)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", ErrTemplateFeature, name, err)
		}
		t.byName[name] = &compiled{t: c, feats: feats}
	}
	if len(t.byName) == 0 {
		return nil, ErrNoTemplate
	}
	for k, v := range tok.ConfigTokens() { // transformers passes its special_tokens_map
		t.special[k] = jinja.NewString(v)
	}
	return t, nil
}

func checkTemplate(src string) error {
	if strings.Contains(src, "{% generation %}") || strings.Contains(src, "{%- generation") {
		return fmt.Errorf("%w: the {%% generation %%} tag", ErrTemplateFeature)
	}
	return nil
}

// SetClock replaces the clock strftime_now reads (tests pin the date).
func (t *Template) SetClock(now func() time.Time) { t.now = now }

// Render renders the prompt text of r.
func (t *Template) Render(r *Request) (string, error) {
	c := t.byName["default"]
	if present(r.Tools) && t.byName["tool_use"] != nil || c == nil {
		c = t.byName["tool_use"]
	}
	data := make(map[string]jinja.Value, 8+r.Kwargs.Len())
	for k, v := range t.special {
		data[k] = v
	}
	data["strftime_now"] = jinja.NewCallable("strftime_now", t.strftimeNow)
	for _, k := range r.Kwargs.OrderedKeys() {
		v, _ := r.Kwargs.Get(k)
		data[k] = v
	}
	data["messages"] = r.Messages
	final := r.finalContent
	if t.parts {
		data["messages"] = r.PartsMessages
		final = r.finalLastPart
	}
	data["tools"] = r.Tools
	data["documents"] = r.Documents
	data["add_generation_prompt"] = jinja.NewBool(r.AddGenerationPrompt)
	if err := r.refusal(c.feats); err != nil {
		return "", err
	}
	st := &renderState{nums: r.info.nums}
	st.bind(data)
	s, err := c.t.RenderValues(data)
	if st.refused != nil {
		return "", st.refused
	}
	if err != nil {
		return "", fmt.Errorf("%w: chat template: %v", ErrBadRequest, err)
	}
	if r.ContinueFinalMessage {
		if t.parts && !r.finalHasPart {
			return "", bad("continue_final_message is set but the final message has no text to continue")
		}
		return continueFinal(s, final)
	}
	return s, nil
}

// continueFinal cuts the prompt after the final message, as transformers' apply_chat_template
// does with continue_final_message.
func continueFinal(s, final string) (string, error) {
	trimmed := strings.TrimSpace(final)
	loc := strings.LastIndex(s, trimmed)
	if loc < 0 {
		return "", bad("continue_final_message is set but the final message does not appear in the rendered chat")
	}
	lstripped := strings.TrimLeft(final, " \t\n\r\v\f")
	if end := loc + len(lstripped); end <= len(s) && s[loc:end] == final {
		return s[:end], nil
	}
	return s[:loc+len(trimmed)], nil
}

// Encode renders r and tokenizes the prompt.
func (t *Template) Encode(r *Request) ([]uint32, error) {
	s, err := t.Render(r)
	if err != nil {
		return nil, err
	}
	return t.tok.Encode(s, r.AddSpecialTokens), nil
}

// EncodeBody parses a chat request body, renders it and tokenizes it.
func (t *Template) EncodeBody(body []byte) ([]uint32, error) {
	r, err := ParseRequest(body)
	if err != nil {
		return nil, err
	}
	return t.Encode(r)
}

// strftimeNow formats the clock with the common strftime directives.
func (t *Template) strftimeNow(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 || !args[0].IsString() {
		return jinja.Undefined(), errors.New("strftime_now takes one format string")
	}
	now := t.now()
	var sb strings.Builder
	f := args[0].AsString()
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			sb.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			sb.WriteString(now.Format("2006"))
		case 'y':
			sb.WriteString(now.Format("06"))
		case 'm':
			sb.WriteString(now.Format("01"))
		case 'd':
			sb.WriteString(now.Format("02"))
		case 'B':
			sb.WriteString(now.Format("January"))
		case 'b':
			sb.WriteString(now.Format("Jan"))
		case 'A':
			sb.WriteString(now.Format("Monday"))
		case 'a':
			sb.WriteString(now.Format("Mon"))
		case 'H':
			sb.WriteString(now.Format("15"))
		case 'M':
			sb.WriteString(now.Format("04"))
		case 'S':
			sb.WriteString(now.Format("05"))
		case '%':
			sb.WriteByte('%')
		default:
			return jinja.Undefined(), fmt.Errorf("strftime_now: directive %%%c is not supported", f[i])
		}
	}
	return jinja.NewString(sb.String()), nil
}
