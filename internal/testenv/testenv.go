// Package testenv holds the one rule for "these tests run in CI", shared by every test that needs
// something outside Go (the real tokenizer files, Debian's python3-zmq, the openai npm client) and
// by scripts/test.sh: CI is set to anything but empty, "0" or "false" (CI systems set "true" or
// "1"). Outside CI a missing prerequisite skips the test, saying what to install; in CI it fails,
// because the test script installs every prerequisite and a suite that skipped has not passed.
package testenv

import (
	"os"
	"testing"
)

// InCI reports whether the tests run in CI, by the rule of the package doc.
func InCI() bool {
	switch os.Getenv("CI") {
	case "", "0", "false":
		return false
	}
	return true
}

// Missing skips tb outside CI and fails it in CI, for a prerequisite that is not there: what names
// it, why says what was found and hint says how to get it.
func Missing(tb testing.TB, what string, why error, hint string) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("missing in CI: %s (%v): %s", what, why, hint)
		return
	}
	tb.Skipf("skipped, missing: %s (%v): %s", what, why, hint)
}

// SkipAllocsUnderRace skips an allocation test under the race detector (see Race); the test
// script's non-race pass (`go test -run Allocs`) runs it.
func SkipAllocsUnderRace(tb testing.TB) {
	tb.Helper()
	if Race {
		tb.Skip("allocation counts are meaningless under the race detector; scripts/test.sh runs this test without it")
	}
}
