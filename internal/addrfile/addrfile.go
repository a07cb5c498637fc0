// Package addrfile writes and reads a daemon's bound addresses ("grpc=… http=… gossip=…" on one
// line), which --addr-file asks for so scripts, tests and the demo can use port 0. The file is
// written through a temporary file and a rename, so a reader sees all of it or nothing.
package addrfile

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrIncomplete means the file exists but is not (yet) a whole line.
var ErrIncomplete = errors.New("addrfile: incomplete")

// Write stores addrs (name=address fields in the given order) in path.
func Write(path string, fields ...string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(fields, " ")+"\n"), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}

// Read parses path into name → address.
func Read(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(string(b), "\n") {
		return nil, ErrIncomplete
	}
	out := map[string]string{}
	for _, kv := range strings.Fields(string(b)) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("addrfile %s: field %q is not name=address", path, kv)
		}
		out[k] = v
	}
	return out, nil
}
