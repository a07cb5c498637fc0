package openai

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// The scanner accepts exactly the objects encoding/json accepts, finds the same members (last
// duplicate wins, as in encoding/json), and its work is linear in the body whatever the nesting.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"a":[1,{"b":"c\u00e9"}],"d":null,"e":true,"f":-1.5e3}`, ` { "a" : "x" } `,
		`{"a":1,}`, `{"a"}`, `[1]`, `"x"`, `{"a":01}`, `{"a":"\x"}`, `{"a":1}{}`, `{"\u0061":2,"a":3}`, `{"a":[[[[]]]]}`,
		`{"a":"` + "\x01" + `"}`, `{"a":1.}`, `{"a":-}`, `{"a":tru}`, `{"a":[1 2]}`, "{\"a\":\"\xff\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var s scanner
		got := map[string]json.RawMessage{}
		err := s.members(body, func(k string, v []byte) error {
			got[k] = v
			return nil
		})
		if s.steps > 3*len(body)+16 {
			t.Fatalf("%d steps for %d bytes: super-linear", s.steps, len(body))
		}
		trimmed := bytes.TrimSpace(body)
		isObj := json.Valid(body) && len(trimmed) > 0 && trimmed[0] == '{'
		if (err == nil) != isObj {
			t.Fatalf("%q: scanner error %v, encoding/json valid object %v", body, err, isObj)
		}
		if err != nil {
			return
		}
		var want map[string]json.RawMessage
		if err := json.Unmarshal(body, &want); err != nil {
			t.Fatal(err)
		}
		if len(want) != len(got) {
			t.Fatalf("%q: members %v, encoding/json %v", body, got, want)
		}
		for k, v := range want {
			if !bytes.Equal(got[k], v) {
				t.Fatalf("%q: member %q = %q, encoding/json %q", body, k, got[k], v)
			}
		}
	})
}

func TestScannerDeepNesting(t *testing.T) {
	for _, n := range []int{maxNesting - 1, maxNesting + 1, 100000} {
		body := []byte(`{"a":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`)
		var s scanner
		err := s.members(body, func(string, []byte) error { return nil })
		if (err == nil) != (n < maxNesting) {
			t.Errorf("depth %d: %v", n, err)
		}
		if s.steps > 3*len(body)+16 {
			t.Errorf("depth %d: %d steps for %d bytes", n, s.steps, len(body))
		}
	}
}

// What ParseCompletion accepts is valid JSON whose "prompt" encoding/json reads the same way, and
// the scanner's and prompt parser's steps stay linear in the body.
func FuzzParseCompletion(f *testing.F) {
	for _, s := range []string{`{"prompt":"x"}`, `{"prompt":[1,2],"max_tokens":3}`, `{"prompt":[[1],[2]],"stream":true}`,
		`{"prompt":["a","b"],"model":"m"}`, `{"prompt":[1,2]`, `{"prompt":[1,2]}x`, `{"prompt":[1],"prompt":"y"}`, `{"model":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s := scanner{prompt: &promptParser{}}
		_ = s.members(body, func(string, []byte) error { return nil })
		if s.steps > 3*len(body)+16 {
			t.Fatalf("%d steps for %d bytes: super-linear", s.steps, len(body))
		}
		c, err := ParseCompletion(body)
		if err != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatal(err)
		}
		p, err := ParsePrompt(m["prompt"])
		if err != nil || len(p.Items) != len(c.Prompt.Items) || p.Batch != c.Prompt.Batch {
			t.Fatalf("%q: in-place prompt %+v, alone %+v %v", body, c.Prompt, p, err)
		}
		for i := range p.Items {
			if p.Items[i].Start != c.Prompt.Items[i].Start || p.Items[i].End != c.Prompt.Items[i].End || p.Items[i].Text != c.Prompt.Items[i].Text {
				t.Fatalf("%q: item %d differs: %+v vs %+v", body, i, p.Items[i], c.Prompt.Items[i])
			}
		}
	})
}
