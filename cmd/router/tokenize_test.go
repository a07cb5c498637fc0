package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/tokenizer/tokenizertest"
)

// TestTokenizeCommand: the tokenize subcommand prints the golden ids, one line per input line,
// for chat requests (--chat) and for completion prompts (with the BOS), and an error object for
// a bad line.
func TestTokenizeCommand(t *testing.T) {
	dir := tokenizertest.Dir(t, "llama3_1")
	b, err := os.ReadFile(tokenizertest.Golden("chat_llama3_1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []struct {
			Request json.RawMessage `json:"request"`
			IDs     []uint32        `json:"ids"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	var want []string
	for _, c := range g.Cases {
		if c.IDs == nil {
			continue
		}
		in.Write(bytes.ReplaceAll(c.Request, []byte("\n"), nil))
		in.WriteByte('\n')
		w, _ := json.Marshal(c.IDs)
		want = append(want, string(w))
	}
	in.WriteString(`{"messages": []}` + "\n")
	var out, errb bytes.Buffer
	code := tokenizeLines(context.Background(), []string{"--tokenizer", "hf:" + dir, "--chat"}, &in, &out, &errb)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if code != 1 || len(lines) != len(want)+1 || !strings.Contains(errb.String(), "line") {
		t.Fatalf("exit %d, %d lines for %d requests, stderr %q", code, len(lines), len(want)+1, errb.String())
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("request %d: got %s\nwant %s", i, lines[i], w)
		}
	}
	if !strings.HasPrefix(lines[len(want)], `{"error":`) {
		t.Errorf("bad line printed %s", lines[len(want)])
	}

	out.Reset()
	code = tokenizeLines(context.Background(), []string{"--tokenizer", "hf:" + dir}, strings.NewReader(`"Hello, world!"`+"\n"), &out, &errb)
	if code != 0 || out.String() != "[128000,9906,11,1917,0]\n" {
		t.Fatalf("text prompt: exit %d, %q", code, out.String())
	}
	if code := tokenizeLines(context.Background(), nil, strings.NewReader(""), &out, &errb); code != 2 {
		t.Fatalf("no --tokenizer: exit %d", code)
	}
}
