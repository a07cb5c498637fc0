package chat

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// ErrBadRequest marks a request the chat path cannot render (wrong shapes, conflicting flags):
// the caller's fault, an HTTP 400.
var ErrBadRequest = errors.New("invalid chat request")

func bad(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, a...))
}

// Request is an OpenAI chat request reduced to what the prompt depends on, in the form vLLM gives
// the template (vllm/entrypoints/chat_utils.py and ChatCompletionRequest).
type Request struct {
	Messages             jinja.Value // list of message dicts, after vLLM's rewriting ("string" content)
	PartsMessages        jinja.Value // the same with content as a list of text parts (vLLM's "openai" format)
	Tools                jinja.Value // list of tool dicts, or None
	Documents            jinja.Value // None unless given
	AddGenerationPrompt  bool        // default true
	ContinueFinalMessage bool
	AddSpecialTokens     bool // default false: the template writes the special tokens
	Kwargs               *jinja.Dict
	finalContent         string // the last message's text, for continue_final_message
	finalLastPart        string // its last text part (what transformers continues in the parts format)
	finalHasPart         bool
	info                 parseInfo // numbers and characters rendering must treat as Python does
}

// reservedKwargs are the template variables chat_template_kwargs may not replace (Python would
// refuse the duplicate keyword).
var reservedKwargs = map[string]bool{"messages": true, "tools": true, "documents": true, "add_generation_prompt": true}

// ParseRequest reads a /v1/chat/completions (or chat /tokenize) body.
func ParseRequest(body []byte) (*Request, error) {
	r := &Request{AddGenerationPrompt: true, Tools: jinja.None(), Documents: jinja.None(), Kwargs: jinja.NewDict().AsDict()}
	v, err := parseOrdered(body, &r.info)
	if err != nil {
		return nil, bad("body: %v", err)
	}
	if !v.IsDict() {
		return nil, bad("body must be a JSON object")
	}
	return r, r.fromDict(v.AsDict())
}

func (r *Request) fromDict(d *jinja.Dict) error {
	var err error
	if r.AddGenerationPrompt, err = boolField(d, "add_generation_prompt", true); err != nil {
		return err
	}
	if r.ContinueFinalMessage, err = boolField(d, "continue_final_message", false); err != nil {
		return err
	}
	if r.AddSpecialTokens, err = boolField(d, "add_special_tokens", false); err != nil {
		return err
	}
	if r.AddGenerationPrompt && r.ContinueFinalMessage {
		return bad("add_generation_prompt and continue_final_message cannot both be true")
	}
	if ct := get(d, "chat_template"); present(ct) {
		return bad("field \"chat_template\": request-supplied chat templates are not accepted")
	}
	msgs := get(d, "messages")
	if !msgs.IsList() || msgs.AsList().Len() == 0 {
		return bad("field \"messages\" is required and must be a non-empty array")
	}
	out := make([]jinja.Value, 0, msgs.AsList().Len())
	parts := make([]jinja.Value, 0, msgs.AsList().Len())
	for i, m := range msgs.AsList().Items {
		pm, texts, err := parseMessage(m, &r.info)
		if err != nil {
			return bad("messages[%d]: %v", i, err)
		}
		out = append(out, pm)
		parts = append(parts, withParts(pm, texts))
		r.finalContent = joinTexts(texts)
		r.finalLastPart, r.finalHasPart = "", len(texts) > 0
		if r.finalHasPart {
			r.finalLastPart = texts[len(texts)-1]
		}
	}
	r.Messages = jinja.NewList(out)
	r.PartsMessages = jinja.NewList(parts)
	if tools := get(d, "tools"); present(tools) {
		if !tools.IsList() {
			return bad("field \"tools\" must be an array")
		}
		dumped := make([]jinja.Value, 0, tools.AsList().Len())
		for i, t := range tools.AsList().Items {
			dt, err := dumpTool(t)
			if err != nil {
				return bad("tools[%d]: %v", i, err)
			}
			dumped = append(dumped, dt)
		}
		r.Tools = jinja.NewList(dumped)
	}
	if docs := get(d, "documents"); present(docs) {
		r.Documents = docs
	}
	if kw := get(d, "chat_template_kwargs"); present(kw) {
		if !kw.IsDict() {
			return bad("field \"chat_template_kwargs\" must be an object")
		}
		for _, k := range kw.AsDict().OrderedKeys() {
			if reservedKwargs[k] {
				return bad("chat_template_kwargs may not set %q", k)
			}
			v, _ := kw.AsDict().Get(k)
			r.Kwargs.Set(k, v)
		}
	}
	return nil
}

func boolField(d *jinja.Dict, key string, def bool) (bool, error) {
	v := get(d, key)
	if !present(v) {
		return def, nil
	}
	if !v.IsBool() {
		return false, bad("field %q must be a boolean", key)
	}
	return v.AsBool(), nil
}

// parseMessage applies vLLM's _parse_chat_message_content with the "string" content format:
// text parts are joined with "\n" (null content is ""), and only role, content, tool_calls
// (assistant), tool_call_id (tool), name and reasoning are kept. Then _postprocess_messages:
// tool-call arguments given as JSON strings are parsed (empty or invalid: {}), and an empty
// tool_calls list is dropped. It returns the message and its content's text parts.
func parseMessage(m jinja.Value, info *parseInfo) (jinja.Value, []string, error) {
	if !m.IsDict() {
		return m, nil, errors.New("must be an object")
	}
	md := m.AsDict()
	role := get(md, "role")
	if !role.IsString() || role.AsString() == "" {
		return m, nil, errors.New("\"role\" must be a non-empty string")
	}
	texts, err := contentTexts(get(md, "content"))
	if err != nil {
		return m, nil, err
	}
	out := jinja.NewDict()
	od := out.AsDict()
	od.Set("role", role)
	od.Set("content", jinja.NewString(joinTexts(texts)))
	switch role.AsString() {
	case "assistant":
		if tc := get(md, "tool_calls"); present(tc) {
			if !tc.IsList() {
				return m, nil, errors.New("\"tool_calls\" must be an array")
			}
			if tc.AsList().Len() > 0 {
				calls, err := toolCalls(tc.AsList().Items, info)
				if err != nil {
					return m, nil, err
				}
				od.Set("tool_calls", calls)
			}
		}
	case "tool":
		if id, ok := md.Get("tool_call_id"); ok {
			od.Set("tool_call_id", id)
		}
	}
	if n := get(md, "name"); n.IsString() {
		od.Set("name", n)
	}
	if role.AsString() == "assistant" {
		// reasoning = message.get("reasoning") or message.get("reasoning_content")
		r := get(md, "reasoning")
		if !r.IsTruthy() {
			r = get(md, "reasoning_content")
		}
		if present(r) {
			od.Set("reasoning", r)
			od.Set("reasoning_content", r)
		}
	}
	return out, texts, nil
}

// withParts is a message of the "string" format with its content as vLLM's "openai" format
// has it: a list of {"type": "text", "text": …} (empty for null content).
func withParts(m jinja.Value, texts []string) jinja.Value {
	items := make([]jinja.Value, 0, len(texts))
	for _, t := range texts {
		p := jinja.NewDict()
		p.AsDict().Set("type", jinja.NewString("text"))
		p.AsDict().Set("text", jinja.NewString(t))
		items = append(items, p)
	}
	out := jinja.NewDict()
	for _, k := range m.AsDict().OrderedKeys() {
		v, _ := m.AsDict().Get(k)
		if k == "content" {
			v = jinja.NewList(items)
		}
		out.AsDict().Set(k, v)
	}
	return out
}

// textPartKeys are the content part types vLLM reads as text, with the key holding the text
// (vllm/entrypoints/chat_utils.py, MM_PARSER_MAP and _parse_chat_message_content_part).
var textPartKeys = map[string]string{"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}

// joinTexts is the "string" content format: the parts joined with "\n", empty ones left out
// (vLLM keeps only truthy parsed parts).
func joinTexts(texts []string) string {
	n := 0
	for _, t := range texts {
		if t != "" {
			n++
		}
	}
	if n == len(texts) {
		return strings.Join(texts, "\n")
	}
	kept := make([]string, 0, n)
	for _, t := range texts {
		if t != "" {
			kept = append(kept, t)
		}
	}
	return strings.Join(kept, "\n")
}

// contentTexts returns a content value's text parts (a string is one part, null none).
func contentTexts(c jinja.Value) ([]string, error) {
	switch {
	case !present(c):
		return nil, nil
	case c.IsString():
		return []string{c.AsString()}, nil
	case c.IsList():
		var texts []string
		for i, p := range c.AsList().Items {
			if p.IsString() {
				texts = append(texts, p.AsString())
				continue
			}
			if !p.IsDict() {
				return nil, fmt.Errorf("content[%d] must be an object", i)
			}
			typ := get(p.AsDict(), "type")
			t := "?"
			if typ.IsString() {
				t = typ.AsString()
			}
			key, ok := textPartKeys[t]
			if !ok {
				return nil, fmt.Errorf("content[%d]: only text parts are supported, got type %q", i, t)
			}
			txt := get(p.AsDict(), key)
			if !present(txt) && (t == "text" || t == "refusal") {
				continue // vLLM skips a text or refusal part without content
			}
			if !txt.IsString() {
				return nil, fmt.Errorf("content[%d]: a %q part needs a string %q", i, t, key)
			}
			texts = append(texts, txt.AsString())
		}
		return texts, nil
	}
	return nil, errors.New("\"content\" must be a string, null or an array of parts")
}

// toolCalls copies tool calls, parsing string arguments as vLLM does.
func toolCalls(items []jinja.Value, info *parseInfo) (jinja.Value, error) {
	out := make([]jinja.Value, 0, len(items))
	for i, it := range items {
		if !it.IsDict() {
			return it, fmt.Errorf("tool_calls[%d] must be an object", i)
		}
		fn := get(it.AsDict(), "function")
		if !fn.IsDict() {
			return it, fmt.Errorf("tool_calls[%d].function must be an object", i)
		}
		nf := jinja.NewDict()
		for _, k := range fn.AsDict().OrderedKeys() {
			v, _ := fn.AsDict().Get(k)
			nf.AsDict().Set(k, v)
		}
		args := get(fn.AsDict(), "arguments")
		switch {
		case args.IsDict() || args.IsList():
		case args.IsString() && args.AsString() != "":
			parsed, err := parseOrdered([]byte(args.AsString()), info)
			if err != nil {
				parsed = jinja.NewDict()
			}
			nf.AsDict().Set("arguments", parsed)
		case args.IsTruthy():
			// a number or true: json.loads(str) in Python would see a non-string; keep it.
		default:
			nf.AsDict().Set("arguments", jinja.NewDict())
		}
		nc := jinja.NewDict()
		for _, k := range it.AsDict().OrderedKeys() {
			if k == "function" {
				nc.AsDict().Set(k, nf)
				continue
			}
			v, _ := it.AsDict().Get(k)
			nc.AsDict().Set(k, v)
		}
		out = append(out, nc)
	}
	return jinja.NewList(out), nil
}

// dumpTool is vLLM's tool.model_dump(): {"type", "function": {"name", "description",
// "parameters", extra keys…}, extra keys…}, with description and parameters null when absent.
func dumpTool(t jinja.Value) (jinja.Value, error) {
	if !t.IsDict() {
		return t, errors.New("must be an object")
	}
	td := t.AsDict()
	fn := get(td, "function")
	if !fn.IsDict() {
		return t, errors.New("\"function\" must be an object")
	}
	fd := fn.AsDict()
	name := get(fd, "name")
	if !name.IsString() {
		return t, errors.New("function.name must be a string")
	}
	nf := jinja.NewDict()
	nf.AsDict().Set("name", name)
	for _, k := range []string{"description", "parameters"} {
		v := get(fd, k)
		if v.IsUndefined() {
			v = jinja.None()
		}
		nf.AsDict().Set(k, v)
	}
	for _, k := range fd.OrderedKeys() {
		if !nf.AsDict().Has(k) {
			v, _ := fd.Get(k)
			nf.AsDict().Set(k, v)
		}
	}
	typ := get(td, "type")
	if typ.IsUndefined() {
		typ = jinja.NewString("function")
	}
	if !typ.IsString() || typ.AsString() != "function" {
		return t, errors.New("type must be \"function\"")
	}
	out := jinja.NewDict()
	out.AsDict().Set("type", typ)
	out.AsDict().Set("function", nf)
	for _, k := range td.OrderedKeys() {
		if !out.AsDict().Has(k) {
			v, _ := td.Get(k)
			out.AsDict().Set(k, v)
		}
	}
	return out, nil
}
