// Package tokenizertest locates the real model tokenizer files the tests of prefixmesh run on
// (fetched by scripts/fetch-tokenizers.sh into .cache/tokenizers, or $PREFIXMESH_TOKENIZERS).
// A test that needs them is skipped, saying why, when they are absent, except in CI (the rule of
// internal/testenv), where their absence fails it.
package tokenizertest

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
)

// Root is the directory holding one subdirectory per model.
func Root() string {
	if r := os.Getenv("PREFIXMESH_TOKENIZERS"); r != "" {
		return r
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", ".cache", "tokenizers")
}

// Dir returns the model's directory (llama3, llama3_1, qwen3, deepseek_v3, llama2), skipping
// or failing tb as the package doc says when it has no tokenizer.json.
func Dir(tb testing.TB, model string) string {
	tb.Helper()
	dir := filepath.Join(Root(), model)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		testenv.Missing(tb, "the tokenizer files for "+model, err, "run scripts/fetch-tokenizers.sh (scripts/test.sh does)")
	}
	return dir
}

// Golden returns the path of a golden file under tokenizer/testdata/golden.
func Golden(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", "golden", name)
}
