package flagfile

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func newSet() (*flag.FlagSet, *string, *int, *bool, *multi) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := fs.String("listen", "a", "")
	n := fs.Int("blocks", 1, "")
	b := fs.Bool("insecure", false, "")
	var j multi
	fs.Var(&j, "join", "")
	return fs, s, n, b, &j
}

func TestParseFileAndCommandLinePrecedence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flags")
	content := "# comment\n\n--listen=:7070\nblocks = 42\n--insecure\n--join=a\n--join=b\n"
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	fs, s, n, b, j := newSet()
	if err := Parse(fs, []string{"--config", path, "--blocks=7"}); err != nil {
		t.Fatal(err)
	}
	if *s != ":7070" || *n != 7 || !*b || j.String() != "a,b" {
		t.Fatalf("listen=%q blocks=%d insecure=%v join=%q", *s, *n, *b, j.String())
	}
}

func TestApplyErrors(t *testing.T) {
	cases := map[string]string{
		"unknown flag":   "--nope=1\n",
		"missing value":  "--listen\n",
		"bad value":      "--blocks=x\n",
		"config in file": "--config=other\n",
		"line too long":  "--listen=" + strings.Repeat("x", maxLineBytes+1) + "\n",
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			fs, _, _, _, _ := newSet()
			fs.String(ConfigFlag, "", "")
			if err := Apply(fs, strings.NewReader(content), "f"); err == nil {
				t.Fatalf("Apply(%q) accepted bad input", content)
			}
		})
	}
}

func TestParseMissingFile(t *testing.T) {
	fs, _, _, _, _ := newSet()
	if err := Parse(fs, []string{"--config", filepath.Join(t.TempDir(), "absent")}); err == nil {
		t.Fatal("missing config file accepted")
	}
}
