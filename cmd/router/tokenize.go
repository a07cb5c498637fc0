package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
)

const tokenizeUsage = `usage: prefixmesh-router tokenize --tokenizer SPEC [--chat] [--special=false] < lines.jsonl

Reads JSON lines on stdin and writes, per line, the JSON array of token ids the router computes
for it (the ids the engine will cache), or {"error": "…"} if that line cannot be tokenized.
  text lines: a JSON string, tokenized as a /v1/completions prompt (with the model's BOS,
              as vLLM's add_special_tokens=true; --special=false leaves it out)
  --chat:     a JSON object with "messages" and any chat fields (tools, chat_template_kwargs,
              add_generation_prompt, continue_final_message …), rendered with the model's
              chat template as vLLM does
SPEC is cl100k_base, bytes, hf:DIR (a directory with tokenizer.json and tokenizer_config.json)
or render:URL (a vLLM render server). Exit status: 0 all lines ok, 1 some line failed, 2 usage.
`

// maxTokenizeLine bounds one input line: 8 MiB, the router's request body cap.
const maxTokenizeLine = 8 << 20

func runTokenize(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return tokenizeLines(ctx, args, os.Stdin, stdout, stderr)
}

func tokenizeLines(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	spec := fs.String("tokenizer", "", "tokenizer `spec`: cl100k_base, bytes, hf:DIR or render:URL")
	chat := fs.Bool("chat", false, "lines are chat requests (objects with \"messages\")")
	special := fs.Bool("special", true, "text lines: add the model's special tokens (BOS), as a completions prompt")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, tokenizeUsage)
			return 0
		}
		fmt.Fprint(stderr, tokenizeUsage)
		return 2
	}
	if *spec == "" || fs.NArg() > 0 {
		fmt.Fprint(stderr, tokenizeUsage)
		return 2
	}
	tok, err := tokenizer.New(*spec)
	if err != nil {
		fmt.Fprintf(stderr, "tokenize: %v\n", err)
		return 2
	}
	in := bufio.NewScanner(stdin)
	in.Buffer(make([]byte, 64<<10), maxTokenizeLine)
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	code := 0
	for n := 1; in.Scan(); n++ {
		line := bytes.TrimSpace(in.Bytes())
		if len(line) == 0 {
			continue
		}
		ids, err := tokenizeLine(ctx, tok, line, *chat, *special)
		if err != nil {
			code = 1
			fmt.Fprintf(stderr, "tokenize: line %d: %v\n", n, err)
			b, _ := json.Marshal(map[string]string{"error": err.Error()})
			out.Write(append(b, '\n'))
			continue
		}
		if ids == nil {
			ids = []uint32{}
		}
		b, _ := json.Marshal(ids)
		out.Write(append(b, '\n'))
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(stderr, "tokenize: read stdin: %v\n", err)
		return 1
	}
	return code
}

func tokenizeLine(ctx context.Context, tok tokenizer.Tokenizer, line []byte, chat, special bool) ([]uint32, error) {
	if chat {
		var req struct {
			Messages []tokenizer.ChatMessage `json:"messages"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			return nil, fmt.Errorf("a chat line must be a JSON object with \"messages\": %w", err)
		}
		return tokenizer.EncodeChat(ctx, tok, line, req.Messages)
	}
	var text string
	if err := json.Unmarshal(line, &text); err != nil {
		return nil, fmt.Errorf("a text line must be a JSON string (use --chat for requests): %w", err)
	}
	if !special {
		return tok.Encode(text), nil
	}
	return tokenizer.EncodePrompt(ctx, tok, text)
}
