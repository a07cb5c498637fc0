package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ardanlabs/jinja"

	"github.com/prefixmesh/prefixmesh/tokenizer"
)

// fuzzTemplate prints everything of a request through the Python filters.
const fuzzTemplate = `{% for m in messages %}{{ m.role }}{{ m.content | trim }}{{ m | tojson }}{{ m }}` +
	`{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson(indent=1, sort_keys=true) }}{{ c.function.arguments | string }}{% endfor %}{% endfor %}` +
	`{{ tools | tojson(ensure_ascii=true) }}{{ tools }}`

// FuzzParseRequest: any body is either a Request or an ErrBadRequest / ErrUnsupported error,
// never a panic; a valid JSON object ParseRequest accepts is one encoding/json accepts too, or
// one with what Python's json.loads adds (NaN, Infinity, numbers past the float range). An
// accepted request renders through the Python filters without a panic.
func FuzzParseRequest(f *testing.F) {
	rw, feats, err := rewriteTemplate(fuzzTemplate)
	if err != nil {
		f.Fatal(err)
	}
	ct, err := jinja.Compile(rw)
	if err != nil {
		f.Fatal(err)
	}
	tm := &Template{byName: map[string]*compiled{"default": {t: ct, feats: feats}}, special: map[string]jinja.Value{}, now: time.Now}
	for _, s := range []string{
		`{"messages": [{"role": "user", "content": "Hi"}]}`,
		`{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}], "tools": [{"function": {"name": "f"}}]}`,
		`{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}], "chat_template_kwargs": {"enable_thinking": false}}`,
		`{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false, "continue_final_message": true}`,
		`{"messages": [{"role": "tool", "content": "1.5e3", "tool_call_id": 7}]}`, `[]`, `{`, `{"messages": [[[[[[]]]]]]}`,
		`{"a": "\ud800"}`, `{"messages": [{"role": "user", "content": "\u0000"}]} trailing`,
		`{"messages": [{"role": "assistant", "content": "\u001f", "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1e400, \"b\": NaN, \"c\": 18446744073709551616, \"d\": 1.0}"}}]}], "tools": [{"function": {"name": "f", "parameters": {"m": -Infinity}}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseRequest(body)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) && !errors.Is(err, tokenizer.ErrUnsupported) {
				t.Fatalf("error of an unknown kind: %v", err)
			}
			return
		}
		if r.Messages.AsList().Len() == 0 {
			t.Fatal("accepted a request without messages")
		}
		var v map[string]any
		if err := json.Unmarshal(body, &v); err != nil {
			var ute *json.UnmarshalTypeError
			if !bytes.Contains(body, []byte("NaN")) && !bytes.Contains(body, []byte("Infinity")) && !errors.As(err, &ute) {
				t.Fatalf("accepted what encoding/json rejects (%v): %q", err, body)
			}
		}
		if _, err := tm.Render(r); err != nil && !errors.Is(err, ErrBadRequest) && !errors.Is(err, tokenizer.ErrUnsupported) {
			t.Fatalf("render: error of an unknown kind: %v", err)
		}
	})
}

// FuzzParseOrdered: the ordered parser accepts what encoding/json accepts (but for its depth
// cap and integers longer than Python reads) and yields the same values; beyond that it accepts
// only what Python's json.loads adds: NaN, Infinity, -Infinity and numbers past the float range.
func FuzzParseOrdered(f *testing.F) {
	for _, s := range []string{`{"b": 1, "a": [true, false, null, "x\u00e9\ud83d\ude00"]}`, `"\ud800\u0041"`, `-0.5e-3`,
		`{"a": {"a": {}}}`, `[1, 2,]`, `"\x01"`, `{"k": 1, "k": 2}`, "\"\xff\"", `01`, ` [ ] `, `"\/\b\f\n\r\t"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := parseOrdered(b, &parseInfo{})
		var want any
		werr := json.Unmarshal(b, &want)
		if err != nil {
			if werr == nil && !strings.Contains(err.Error(), "nested deeper") && !strings.Contains(err.Error(), "digits") {
				t.Fatalf("rejected what encoding/json accepts: %q: %v", b, err)
			}
			return
		}
		if werr != nil {
			var ute *json.UnmarshalTypeError
			if !bytes.Contains(b, []byte("NaN")) && !bytes.Contains(b, []byte("Infinity")) && !errors.As(werr, &ute) {
				t.Fatalf("accepted what encoding/json rejects: %q (%v)", b, werr)
			}
			return
		}
		if got := toAny(v); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: got %#v want %#v", b, got, want)
		}
	})
}

func toAny(v jinja.Value) any {
	switch {
	case v.IsNone():
		return nil
	case v.IsBool():
		return v.AsBool()
	case v.IsInt():
		return float64(v.AsInt())
	case v.IsFloat():
		return v.AsFloat()
	case v.IsString():
		return v.AsString()
	case v.IsList():
		out := []any{}
		for _, it := range v.AsList().Items {
			out = append(out, toAny(it))
		}
		return out
	case v.IsDict():
		out := map[string]any{}
		for _, k := range v.AsDict().OrderedKeys() {
			x, _ := v.AsDict().Get(k)
			out[k] = toAny(x)
		}
		return out
	}
	return "?"
}
