// Package buildinfo names the version of the running binary from what the Go toolchain
// stamped into it (runtime/debug.ReadBuildInfo): the main module's version when it was built
// from a tagged module (go install …@v1.2.3, or go build in a tagged checkout), otherwise the
// version-control stamp go build records in a checkout (vcs.revision, vcs.time, vcs.modified;
// see "go help buildinfo" and cmd/go's -buildvcs flag), and "(devel)" only when neither exists
// (go run and go test record no VCS stamp).
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Devel is the version of a binary with neither a module version nor a VCS stamp; it is the
// string the Go toolchain itself uses for an unversioned main module.
const Devel = "(devel)"

// revisionChars is how much of a commit hash the version shows: 12 hex digits, as Go's
// pseudo-versions do (golang.org/ref/mod#pseudo-versions).
const revisionChars = 12

// Version returns the running binary's version; see From.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Devel
	}
	return From(bi)
}

// From returns the version bi describes: its main module's version unless that is empty or
// "(devel)", then "<revision>[-dirty] (<commit time>)" from the VCS stamp, then Devel.
func From(bi *debug.BuildInfo) string {
	if bi == nil {
		return Devel
	}
	if v := bi.Main.Version; v != "" && v != Devel {
		return v
	}
	var rev, at string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return Devel
	}
	if len(rev) > revisionChars {
		rev = rev[:revisionChars]
	}
	var b strings.Builder
	b.WriteString(rev)
	if dirty {
		b.WriteString("-dirty")
	}
	if at != "" {
		b.WriteString(" (" + at + ")")
	}
	return b.String()
}
