package testenv

import "testing"

func TestInCI(t *testing.T) {
	for _, c := range []struct {
		env  string
		want bool
	}{
		{"", false}, {"0", false}, {"false", false},
		{"true", true}, {"1", true}, {"yes", true},
	} {
		t.Setenv("CI", c.env)
		if got := InCI(); got != c.want {
			t.Errorf("CI=%q: InCI() = %v, want %v", c.env, got, c.want)
		}
	}
}

// fakeTB records whether Missing skipped or failed.
type fakeTB struct {
	testing.TB
	skipped, failed bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Skipf(string, ...any)  { f.skipped = true }
func (f *fakeTB) Fatalf(string, ...any) { f.failed = true }

func TestMissingSkipsOutsideCIAndFailsInCI(t *testing.T) {
	t.Setenv("CI", "")
	var out fakeTB
	Missing(&out, "x", nil, "install x")
	if !out.skipped || out.failed {
		t.Errorf("outside CI: skipped=%v failed=%v, want a skip", out.skipped, out.failed)
	}
	t.Setenv("CI", "1")
	var in fakeTB
	Missing(&in, "x", nil, "install x")
	if !in.failed || in.skipped {
		t.Errorf("CI=1: skipped=%v failed=%v, want a failure", in.skipped, in.failed)
	}
}
