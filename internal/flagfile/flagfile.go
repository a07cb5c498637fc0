// Package flagfile lets a daemon take its flags from a file as well as the command line, so a
// Kubernetes ConfigMap can carry the configuration: `--config FILE` names a file of flags, one per
// line (`--name=value`, `name=value` or `--bool-flag`; blank lines and lines starting with # are
// skipped). Flags given on the command line win over the file, whatever their order.
package flagfile

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// ConfigFlag is the name of the flag that names the file.
const ConfigFlag = "config"

// maxLineBytes bounds one line of the file; a flag value longer than this is a mistake, not config.
const maxLineBytes = 64 << 10

// Parse registers --config on fs, parses args, then applies the named file's flags that were not
// set on the command line.
func Parse(fs *flag.FlagSet, args []string) error {
	path := fs.String(ConfigFlag, "", "read further flags from `FILE`, one --name=value per line (command-line flags win)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return nil
	}
	f, err := os.Open(*path)
	if err != nil {
		return fmt.Errorf("open config file: %w", err)
	}
	defer f.Close()
	return Apply(fs, f, *path)
}

// Apply sets on fs every flag listed in r that was not already set explicitly.
func Apply(fs *flag.FlagSet, r io.Reader, name string) error {
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxLineBytes)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		key, value, hasValue := strings.Cut(strings.TrimLeft(text, "-"), "=")
		key = strings.TrimSpace(key)
		f := fs.Lookup(key)
		if f == nil || key == ConfigFlag {
			return fmt.Errorf("%s:%d: unknown flag %q", name, line, key)
		}
		if !hasValue {
			if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
				value = "true"
			} else {
				return fmt.Errorf("%s:%d: flag %q needs a value", name, line, key)
			}
		}
		if explicit[key] {
			continue
		}
		if err := fs.Set(key, strings.TrimSpace(value)); err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("%s:%d: line longer than %d bytes", name, line+1, maxLineBytes)
		}
		return fmt.Errorf("read %s: %w", name, err)
	}
	return nil
}
