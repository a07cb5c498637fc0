package tokenizer

import (
	"encoding/json"
	"errors"
	"reflect"
	"sync"
	"testing"
	"unicode/utf8"
)

func mustNew(t testing.TB, name string) Tokenizer {
	t.Helper()
	tk, err := New(name)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return tk
}

// Fixed vectors: the cl100k_base ids agree with OpenAI's tiktoken (Python) for the same strings.
func TestEncodeFixedVectors(t *testing.T) {
	cases := []struct {
		name, text string
		want       []uint32
	}{
		{CL100kBase, "hello world", []uint32{15339, 1917}},
		{CL100kBase, " the", []uint32{279}},
		{CL100kBase, "<|user|>\nHi there\n<|assistant|>\n", []uint32{27, 91, 882, 91, 397, 13347, 1070, 198, 27, 91, 78191, 91, 397}},
		// Special tokens are never produced from text.
		{CL100kBase, "<|endoftext|>", []uint32{27, 91, 8862, 728, 428, 91, 29}},
		{CL100kBase, "", nil},
		{Bytes, "hi é", []uint32{'h', 'i', ' ', 0xC3, 0xA9}},
		{Bytes, "", nil},
	}
	for _, c := range cases {
		tk := mustNew(t, c.name)
		if got := tk.Encode(c.text); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s.Encode(%q) = %v, want %v", c.name, c.text, got, c.want)
		}
		if got := tk.Decode(c.want); got != c.text {
			t.Errorf("%s.Decode(%v) = %q, want %q", c.name, c.want, got, c.text)
		}
		if tk.Name() != c.name {
			t.Errorf("Name() = %q, want %q", tk.Name(), c.name)
		}
	}
}

func TestRoundTripAndDeterminism(t *testing.T) {
	texts := []string{"The quick brown fox 🦊 jumps over 1234567 lazy dogs.\n\n\tdone", "日本語のテキスト", "a"}
	for _, name := range []string{CL100kBase, Bytes} {
		a, b := mustNew(t, name), mustNew(t, name)
		for _, s := range texts {
			ids := a.Encode(s)
			if !reflect.DeepEqual(ids, b.Encode(s)) {
				t.Errorf("%s: two instances disagree on %q", name, s)
			}
			if got := a.Decode(ids); got != s {
				t.Errorf("%s: round trip of %q gave %q", name, s, got)
			}
		}
	}
}

func TestDecodeInvalidIsValidUTF8(t *testing.T) {
	cl := mustNew(t, CL100kBase)
	// 15339 = "hello", 4_000_000_000 is no token, 1917 = " world". The first token of an emoji
	// holds only part of its UTF-8 bytes.
	got := cl.Decode([]uint32{15339, 4_000_000_000, 1917})
	if got != "hello\uFFFD world" {
		t.Errorf("Decode with an unknown id = %q", got)
	}
	if s := cl.Decode(cl.Encode("🦊")[:1]); !utf8.ValidString(s) {
		t.Errorf("Decode of a partial character is not valid UTF-8: %q", s)
	}
	by := mustNew(t, Bytes)
	if s := by.Decode([]uint32{'a', 0xC3, 300, 'b'}); s != "a\uFFFD\uFFFDb" {
		t.Errorf("bytes Decode = %q", s)
	}
}

func TestNewUnknown(t *testing.T) {
	if _, err := New("gpt2-ish"); !errors.Is(err, ErrUnknownTokenizer) {
		t.Fatalf("err = %v, want ErrUnknownTokenizer", err)
	}
}

func TestConcurrentEncode(t *testing.T) {
	tk := mustNew(t, CL100kBase)
	want := tk.Encode("shared prefix for every goroutine, then something else")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if got := tk.Encode("shared prefix for every goroutine, then something else"); !reflect.DeepEqual(got, want) {
					t.Error("concurrent Encode disagrees")
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestRenderChat(t *testing.T) {
	got := RenderChat([]ChatMessage{{"system", "Be brief."}, {"user", "Hi"}})
	want := "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
	if got != want {
		t.Fatalf("RenderChat = %q, want %q", got, want)
	}
	if RenderChat(nil) != "<|assistant|>\n" {
		t.Fatalf("RenderChat(nil) = %q", RenderChat(nil))
	}
	// A follow-up turn shares the earlier turn's rendering as a prefix (minus the final prompt).
	turn1 := []ChatMessage{{"user", "Hi"}}
	turn2 := append(turn1, ChatMessage{"assistant", "Hello"}, ChatMessage{"user", "More"})
	r1, r2 := RenderChat(turn1), RenderChat(turn2)
	base := r1[:len(r1)-len("<|assistant|>\n")]
	if r2[:len(base)] != base {
		t.Fatalf("turn 2 %q does not extend turn 1 %q", r2, base)
	}
}

func TestChatMessageJSON(t *testing.T) {
	cases := []struct {
		in   string
		want ChatMessage
		bad  bool
	}{
		{in: `{"role":"user","content":"hi"}`, want: ChatMessage{"user", "hi"}},
		{in: `{"role":"assistant","content":null}`, want: ChatMessage{"assistant", ""}},
		{in: `{"role":"user"}`, want: ChatMessage{"user", ""}},
		{in: `{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}`, want: ChatMessage{"user", "ab"}},
		{in: `{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}`, bad: true},
		{in: `{"role":"user","content":42}`, bad: true},
	}
	for _, c := range cases {
		var m ChatMessage
		err := json.Unmarshal([]byte(c.in), &m)
		if c.bad {
			if err == nil {
				t.Errorf("%s: accepted", c.in)
			}
			continue
		}
		if err != nil || m != c.want {
			t.Errorf("%s: got %+v, %v; want %+v", c.in, m, err, c.want)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	text := RenderChat([]ChatMessage{{"user", "The quick brown fox jumps over the lazy dog. " + "Lorem ipsum dolor sit amet, consectetur adipiscing elit. "}})
	for _, name := range []string{CL100kBase, Bytes} {
		tk := mustNew(b, name)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.Encode(text)
			}
		})
	}
}
