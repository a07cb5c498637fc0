package chat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/tokenizer"
	"github.com/prefixmesh/prefixmesh/tokenizer/tokenizertest"
)

// chatModels are the models with a chat template among the golden files.
var chatModels = []string{"llama3", "llama3_1", "qwen3", "deepseek_v3", "gemma3"}

func loadTemplate(tb testing.TB, model string) *Template {
	tb.Helper()
	dir := tokenizertest.Dir(tb, model)
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tm, err := New(tok)
	if err != nil {
		tb.Fatal(err)
	}
	// render.py's strftime_now returns this date.
	tm.SetClock(func() time.Time { return time.Date(2024, 7, 26, 0, 0, 0, 0, time.UTC) })
	return tm
}

type chatCase struct {
	Name     string          `json:"name"`
	Request  json.RawMessage `json:"request"`
	Rendered *string         `json:"rendered"`
	Error    string          `json:"error"`
	IDs      []uint32        `json:"ids"`
}

func TestGoldenChat(t *testing.T) {
	for _, m := range chatModels {
		t.Run(m, func(t *testing.T) {
			tm := loadTemplate(t, m)
			b, err := os.ReadFile(filepath.Join("..", "testdata", "golden", "chat_"+m+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var g struct {
				Cases []chatCase `json:"cases"`
			}
			if err := json.Unmarshal(b, &g); err != nil {
				t.Fatal(err)
			}
			for _, c := range g.Cases {
				r, err := ParseRequest(c.Request)
				var got string
				if err == nil {
					got, err = tm.Render(r)
				}
				if c.Rendered == nil {
					if err == nil {
						t.Errorf("%s: rendered, want the error %q", c.Name, c.Error)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", c.Name, err)
					continue
				}
				if got != *c.Rendered {
					i := 0
					for i < len(got) && i < len(*c.Rendered) && got[i] == (*c.Rendered)[i] {
						i++
					}
					t.Errorf("%s: rendering differs at byte %d: got %q want %q", c.Name, i, clip(got, i), clip(*c.Rendered, i))
					continue
				}
				ids := tm.tok.Encode(got, r.AddSpecialTokens)
				if !equal(ids, c.IDs) {
					t.Errorf("%s: ids differ: got %d ids, want %d", c.Name, len(ids), len(c.IDs))
				}
			}
		})
	}
}

func clip(s string, at int) string {
	lo, hi := max(0, at-20), min(len(s), at+40)
	return s[lo:hi]
}

func equal(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestChatTemplateFile: a chat_template.jinja beside tokenizer.json replaces the config's.
func TestChatTemplateFile(t *testing.T) {
	src := tokenizertest.Dir(t, "qwen3")
	dir := t.TempDir()
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := New(tok)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRequest([]byte(`{"messages": [{"role": "user", "content": "Hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if s, err := tm.Render(r); err != nil || s != "[user] Hi\n" {
		t.Fatalf("rendered %q, %v", s, err)
	}
}
