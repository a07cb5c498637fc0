package requests

import (
	"testing"
)

// quickJSONCases are chunks and bodies on which the quick readers either answer or give up;
// where they answer they must agree with encoding/json (decodeOutput, decodeCached).
var quickJSONCases = []string{
	// What engines send (vLLM's completions and chat chunks, the final usage chunk).
	`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" word","logprobs":null,"finish_reason":null}]}`,
	`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" hi"}}]}`,
	`{"id":"c","choices":[],"usage":{"prompt_tokens":8192,"completion_tokens":8,"total_tokens":8200,"prompt_tokens_details":{"cached_tokens":7680}}}`,
	`{"id":"c","choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":{"prompt_tokens_details":null}}`,
	` { "choices" : [ { "text" : "x" } ] , "usage" : { "prompt_tokens_details" : { "cached_tokens" : -0 } } } `,
	// Case folding, nulls, empty containers, other types.
	`{"CHOICES":[{"Text":"a"}],"Usage":{"Prompt_Tokens_Details":{"CACHED_TOKENS":3}}}`,
	`{"choices":null}`, `{"choices":[null,{"text":null},{"delta":null},{"delta":{"content":null}}]}`,
	`{"choices":[{}],"usage":{}}`, `{"choices":[{"delta":{}}],"usage":{"prompt_tokens_details":{}}}`,
	`{"usage":null}`, `{"usage":{"prompt_tokens_details":{"cached_tokens":null}}}`,
	`{"choices":{}}`, `{"choices":"text"}`, `{"choices":[5]}`, `{"choices":[{"text":5}]}`, `{"choices":[{"delta":[]}]}`,
	`{"choices":[{"delta":{"content":true}}]}`, `{"usage":5}`, `{"usage":{"prompt_tokens_details":[]}}`,
	`{"usage":{"prompt_tokens_details":{"cached_tokens":"3"}}}`,
	// Numbers encoding/json will not put in an int, and ones at the edge.
	`{"usage":{"prompt_tokens_details":{"cached_tokens":1.0}}}`, `{"usage":{"prompt_tokens_details":{"cached_tokens":1e3}}}`,
	`{"usage":{"prompt_tokens_details":{"cached_tokens":99999999999999999999}}}`,
	`{"usage":{"prompt_tokens_details":{"cached_tokens":999999999999999999}}}`,
	`{"usage":{"prompt_tokens_details":{"cached_tokens":-999999999999999999}}}`,
	`{"usage":{"prompt_tokens_details":{"cached_tokens":01}}}`, `{"usage":{"prompt_tokens_details":{"cached_tokens":-}}}`,
	// Duplicate fields: encoding/json decodes the second into what the first left.
	`{"choices":[{"text":"a"}],"choices":[{}]}`, `{"choices":[{"text":"a","text":""}]}`, `{"choices":[{"text":"a","text":null}]}`,
	`{"choices":[{"delta":{"content":"a"},"delta":{}}]}`, `{"usage":{"prompt_tokens_details":{"cached_tokens":1}},"usage":{}}`,
	`{"usage":{"prompt_tokens_details":{"cached_tokens":1}},"usage":null}`, `{"usage":{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}}`,
	`{"choices":[{"text":"a"}],"Choices":null}`,
	// Escapes, non-ASCII keys (U+212A folds to k, U+017F to s), control characters.
	`{"choices":[{"t\u0065xt":"a"}]}`, `{"choices":[{"text":"\n"}]}`, `{"choices":[{"text":"\u0000"}]}`,
	"{\"choices\":[{\"te\u017ft\":\"a\"}]}", "{\"u\u017fage\":{\"prompt_tokens_details\":{\"cached_tokens\":4}}}",
	"{\"usage\":{\"prompt_tokens_details\":{\"cached_to\u212aens\":4}}}", "{\"choices\":[{\"text\":\"a\tb\"}]}",
	"{\"choices\":[{\"text\":\"\xff\"}]}",
	// Not JSON, or not an object.
	``, ` `, `{`, `}`, `{"choices":[{"text":"a"}]`, `{"choices":[{"text":"a"}]}x`, `{"choices":[{"text":"a"},]}`,
	`{"choices":[{"text":"a"}],}`, `{"a":tru}`, `{"a":nul}`, `{"a":1.}`, `{"a":1e}`, `{"a" 1}`, `[]`, `null`, `"text"`, `5`,
	`{"choices":[{"text":"a"}]}{}`, `{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
	`{"x":{"y":[true,false,null,-1.5e+3,"s",{}]},"choices":[{"text":"ok"}]}`,
}

// Where the quick readers answer, they answer as encoding/json's decoding does.
func TestQuickJSONAgreesWithEncodingJSON(t *testing.T) {
	quick := 0
	for _, c := range quickJSONCases {
		if checkQuickJSON(t, []byte(c)) {
			quick++
		}
	}
	// The shapes engines send are read without encoding/json.
	for _, c := range quickJSONCases[:6] {
		if _, ok := quickOutput([]byte(c)); !ok {
			t.Errorf("quickOutput gave up on %s", c)
		}
		if _, _, ok := quickCached([]byte(c)); !ok {
			t.Errorf("quickCached gave up on %s", c)
		}
	}
	t.Logf("%d of %d cases answered without encoding/json", quick, len(quickJSONCases))
}

// checkQuickJSON fails t where a quick reader answers otherwise than encoding/json, and reports
// whether both answered.
func checkQuickJSON(t *testing.T, b []byte) bool {
	t.Helper()
	out, ok1 := quickOutput(b)
	if want := decodeOutput(b); ok1 && out != want {
		t.Errorf("quickOutput(%q) = %v, encoding/json %v", b, out, want)
	}
	n, found, ok2 := quickCached(b)
	if wn, wfound := decodeCached(b); ok2 && (n != wn || found != wfound) {
		t.Errorf("quickCached(%q) = %d, %v; encoding/json %d, %v", b, n, found, wn, wfound)
	}
	return ok1 && ok2
}

func FuzzQuickJSON(f *testing.F) {
	for _, c := range quickJSONCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkQuickJSON(t, b) })
}

// Reading an engine's chunks allocates nothing.
func TestQuickJSONAllocs(t *testing.T) {
	chunk, usage := []byte(quickJSONCases[0]), []byte(quickJSONCases[3])
	if n := testing.AllocsPerRun(100, func() {
		if !hasOutput(chunk) {
			t.Fatal("no output")
		}
		if c, ok := cachedTokens(usage); !ok || c != 7680 {
			t.Fatal("no cached_tokens")
		}
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
