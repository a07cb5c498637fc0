package buildinfo

import (
	"runtime/debug"
	"testing"
)

// TestFrom: the settings are the keys runtime/debug documents for BuildSetting ("vcs.revision",
// "vcs.time", "vcs.modified"), with values as `go version -m` prints them for a go build in a
// git checkout; the module versions are what go install …@version and a go build in a tagged
// checkout record (Go 1.24 release notes: "+dirty" for uncommitted changes).
func TestFrom(t *testing.T) {
	stamp := []debug.BuildSetting{
		{Key: "-buildmode", Value: "exe"},
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "37d0ae0d5b8da2a9d81106cf6bb56c3b9f044567"},
		{Key: "vcs.time", Value: "2026-12-02T04:19:52Z"},
		{Key: "vcs.modified", Value: "false"},
	}
	dirty := append(append([]debug.BuildSetting(nil), stamp[:4]...), debug.BuildSetting{Key: "vcs.modified", Value: "true"})
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "(devel)"},
		{"go run: no version, no stamp", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "(devel)"},
		{"empty version, no stamp", &debug.BuildInfo{}, "(devel)"},
		{"go install @tag", &debug.BuildInfo{Main: debug.Module{Version: "v0.3.1"}, Settings: stamp}, "v0.3.1"},
		{"go build, stamped pseudo-version", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261202041952-37d0ae0d5b8d+dirty"}}, "v0.0.0-20261202041952-37d0ae0d5b8d+dirty"},
		{"go build, VCS stamp only", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: stamp}, "37d0ae0d5b8d (2026-12-02T04:19:52Z)"},
		{"go build, uncommitted changes", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: dirty}, "37d0ae0d5b8d-dirty (2026-12-02T04:19:52Z)"},
		{"short revision, no time", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}}}, "abc123"},
	} {
		if got := From(c.bi); got != c.want {
			t.Errorf("%s: From = %q, want %q", c.name, got, c.want)
		}
	}
}
