package chat

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

// pythonGolden is testdata/golden/python.json (testdata/gen/python.py, Debian python3 and
// python3-jinja2): the oracle for the Python printing of python.go and the rewrite of rewrite.go.
type pythonGolden struct {
	Floats []struct {
		Bits string `json:"bits"`
		Repr string `json:"repr"`
		JSON string `json:"json"`
	} `json:"floats"`
	IsSpace  []rune `json:"isspace"`
	Snippets []struct {
		Name     string  `json:"name"`
		Template string  `json:"template"`
		Vars     string  `json:"vars"`
		Rendered *string `json:"rendered"`
		Error    string  `json:"error"`
	} `json:"snippets"`
}

func readPythonGolden(t *testing.T) *pythonGolden {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "golden", "python.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g pythonGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Floats) == 0 || len(g.IsSpace) == 0 || len(g.Snippets) == 0 {
		t.Fatal("python.json: empty section")
	}
	return &g
}

func TestPythonFloatRepr(t *testing.T) {
	g := readPythonGolden(t)
	for _, c := range g.Floats {
		b, err := strconv.ParseUint(c.Bits, 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		f := math.Float64frombits(b)
		if got := pyFloatRepr(f); got != c.Repr {
			t.Errorf("repr(%s): got %q want %q", c.Bits, got, c.Repr)
		}
		if got := pyJSONFloat(f); got != c.JSON {
			t.Errorf("json.dumps(%s): got %q want %q", c.Bits, got, c.JSON)
		}
	}
}

func TestPythonIsSpace(t *testing.T) {
	g := readPythonGolden(t)
	want := map[rune]bool{}
	for _, r := range g.IsSpace {
		want[r] = true
	}
	for r := rune(0); r <= 0x10FFFF; r++ {
		if pyIsSpace(r) != want[r] {
			t.Errorf("U+%04X: pyIsSpace %v, Python's str.isspace %v", r, pyIsSpace(r), want[r])
		}
	}
}

// TestPythonSnippets renders small templates through the rewrite and the Python filters and
// compares with Python Jinja in transformers' environment. A snippet the Go engine renders
// differently for reasons outside the printing of values is listed with the reason.
func TestPythonSnippets(t *testing.T) {
	known := map[string]string{}
	g := readPythonGolden(t)
	for _, c := range g.Snippets {
		got, err := renderSnippet(c.Template, c.Vars)
		switch {
		case c.Rendered == nil && err == nil:
			t.Errorf("%s: rendered %q, Python raised %s", c.Name, got, c.Error)
		case c.Rendered == nil:
		case err != nil:
			t.Errorf("%s: %v, Python rendered %q", c.Name, err, *c.Rendered)
		case got != *c.Rendered && known[c.Name] != "":
			t.Logf("%s: differs as known (%s): got %q want %q", c.Name, known[c.Name], got, *c.Rendered)
		case got != *c.Rendered:
			t.Errorf("%s:\n got %q\nwant %q", c.Name, got, *c.Rendered)
		case known[c.Name] != "":
			t.Errorf("%s: now equal to Python; drop it from the known differences", c.Name)
		}
	}
}

func renderSnippet(src, vars string) (string, error) {
	rw, feats, err := rewriteTemplate(src)
	if err != nil {
		return "", err
	}
	c, err := jinja.Compile(rw)
	if err != nil {
		return "", err
	}
	r := &Request{}
	v, err := parseOrdered([]byte(vars), &r.info)
	if err != nil {
		return "", err
	}
	if err := r.refusal(feats); err != nil {
		return "", err
	}
	data := map[string]jinja.Value{}
	for _, k := range v.AsDict().OrderedKeys() {
		data[k], _ = v.AsDict().Get(k)
	}
	st := &renderState{nums: r.info.nums}
	st.bind(data)
	out, err := c.RenderValues(data)
	if st.refused != nil {
		return "", st.refused
	}
	return out, err
}

// TestRefusals: a request is refused, with its reason, exactly when the template would print or
// inspect one of its values the Go way.
func TestRefusals(t *testing.T) {
	for _, c := range []struct {
		template, vars string
		want           error // nil: renders
	}{
		{`{{ x | tojson }}`, `{"x": 1.0}`, nil},
		{`{{ x }}`, `{"x": 1234567.5}`, nil},
		{`{{ x ~ "" }}`, `{"x": 1.0}`, ErrNumberFormat},
		{`{{ x ~ "" }}`, `{"x": 1.5}`, nil}, // Go's %g prints 1.5 as Python does
		{`{{ [x, 2] | join(",") }}`, `{"x": 1e22}`, nil},
		{`{{ [x, 2] | join(",") }}`, `{"x": 2.0}`, ErrNumberFormat},
		{`{{ "%s" % x }}`, `{"x": 2.0}`, ErrNumberFormat},
		{`{{ i % 2 }}`, `{"i": 3, "x": 2.0}`, nil}, // modulo of numbers prints nothing the Go way
		{`{{ x.strip() }}`, `{"x": "\u001fa"}`, ErrPythonWhitespace},
		{`{{ x.strip("\u001f") }}`, `{"x": "\u001fa"}`, nil},
		{`{{ x | trim }}`, `{"x": "\u001fa"}`, nil},
		{`{{ x.split() }}`, `{"x": "a b"}`, nil},
		{`{% if x is integer %}i{% endif %}`, `{"x": 18446744073709551616}`, ErrBigInteger},
		{`{{ x | tojson }}`, `{"x": 18446744073709551616}`, nil},
		{`{{ [x, y] | tojson }}`, `{"x": 18446744073709551616, "y": 18446744073709551617}`, ErrBigInteger},
		{`{{ [x, y] | tojson }}`, `{"x": 18446744073709551616, "y": 1.8446744073709552e19}`, ErrBigInteger},
		{`{{ [x] }}`, `{"x": "\u0378"}`, ErrPythonRepr}, // unassigned in Unicode 9.0.0
		{`{{ [x] }}`, `{"x": "\u00e9"}`, nil},
	} {
		_, err := renderSnippet(c.template, c.vars)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s with %s: got %v, want %v", c.template, c.vars, err, c.want)
		}
	}
}

func TestRewriteTemplate(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`a{{ x }}b`, `a{{ __pm_str( x ) }}b`},
		{`{{- x|tojson -}}`, `{{- __pm_str( x|__pm_tojson ) -}}`},
		{`{% set y = x | trim %}{{ y }}`, `{% set y = x | __pm_trim %}{{ __pm_str( y ) }}`},
		{`{{ "}}|trim" }}`, `{{ __pm_str( "}}|trim" ) }}`},
		{`{{ {'a': {'b': 1}} }}`, `{{ __pm_str( {'a': {'b': 1}} ) }}`},
		{`{# {{ x }} #}{% raw %}{{ x|trim }}{% endraw %}`, `{# {{ x }} #}{% raw %}{{ x|trim }}{% endraw %}`},
		{`{{ x.trim }}`, `{{ __pm_str( x.trim ) }}`},
	} {
		got, _, err := rewriteTemplate(c.in)
		if err != nil || got != c.want {
			t.Errorf("%q: got %q (%v), want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{`{{ x `, `{{ __pm_str }}`, `{% filter trim %}x{% endfilter %}`, `{{ xs | map('tojson') }}`, `{{ "x }}`, `{{ 1e3 }}`} {
		if _, _, err := rewriteTemplate(bad); err == nil {
			t.Errorf("%q: rewritten, want an error", bad)
		}
	}
	if _, f, _ := rewriteTemplate(`{{ a ~ b }}{{ c.strip() }}{% if d is not integer %}{% endif %}`); !f.stringifies || !f.pyWhitespace || !f.numberTypes {
		t.Errorf("features %+v", f)
	}
	if _, f, _ := rewriteTemplate(`{{ a | tojson }}{{ c.strip('x') }}{{ i % 2 }}`); f.stringifies || f.pyWhitespace || f.numberTypes {
		t.Errorf("features %+v, want none", f)
	}
	if !strings.HasPrefix(pmStr, pmPrefix) {
		t.Fatal("names")
	}
}
