package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// recipePorts are the ports scripts/recipe.sh documents (README "Running it for real"), each
// moved by RECIPE_PORT_OFFSET; gossip ports are TCP and UDP.
var recipePorts = []int{7080, 8081, 7000, 7946, 7171, 7172, 7173, 9001, 9002, 9003, 5551, 5552, 5553,
	5561, 5562, 5563, 7071, 7072, 7073, 8091, 8092, 8093, 7951, 7952, 7953}

// freeOffset finds an offset that puts every recipe port on a free loopback TCP and UDP port (the
// test must not take the documented ports a developer's own cluster may hold).
func freeOffset(t *testing.T) int {
	t.Helper()
	for range 50 {
		off := 10000 + rand.IntN(45000)
		ok := true
		var held []interface{ Close() error }
		for _, p := range recipePorts {
			addr := fmt.Sprintf("127.0.0.1:%d", p+off)
			l, err := net.Listen("tcp", addr)
			if err != nil {
				ok = false
				break
			}
			held = append(held, l)
			u, err := net.ListenPacket("udp", addr)
			if err != nil {
				ok = false
				break
			}
			held = append(held, u)
		}
		for _, h := range held {
			_ = h.Close()
		}
		if ok {
			return off
		}
	}
	t.Fatal("no port offset with every recipe port free")
	return 0
}

// TestReadmeRecipe runs README.md's "Running it for real" as documented: scripts/recipe.sh, which
// the README calls, with --exit so that it stops once its checks pass. It checks that the script
// succeeds, that every step the README shows ("recipe: ok: …" lines) happened, and that it left
// nothing in the checkout (no gossip.key, binaries or Raft data: everything is in its scratch
// directory).
func TestReadmeRecipe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both binaries and grpcurl and runs seven daemons")
	}
	for _, tool := range []string{"bash", "curl", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the recipe needs %s: %v", tool, err)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := readmeSection(string(readme), "## Running it for real")
	if !strings.Contains(section, "\nscripts/recipe.sh\n") {
		t.Fatal(`README's "Running it for real" does not run scripts/recipe.sh`)
	}
	var shown []string
	for _, l := range strings.Split(section, "\n") {
		if strings.HasPrefix(l, "recipe: ok: ") {
			shown = append(shown, l)
		}
	}
	if len(shown) < 5 {
		t.Fatalf("README shows %d recipe steps; want its sample output", len(shown))
	}
	leftovers := []string{"gossip.key", "prefixmesh-node", "prefixmesh-router", "data/raft"}
	before := map[string]bool{}
	for _, f := range leftovers {
		_, err := os.Stat(filepath.Join(root, f))
		before[f] = err == nil
	}

	ctx := t.Context()
	if dl, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-time.Until(dl)/10))
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "recipe.sh"), "--exit")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "RECIPE_DIR="+t.TempDir(), fmt.Sprintf("RECIPE_PORT_OFFSET=%d", freeOffset(t)), "RECIPE_WAIT=120")
	// On the deadline, SIGTERM: the script's trap stops its daemons.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("scripts/recipe.sh --exit:\n%s", out.String())
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("recipe failed: exit %d", ee.ExitCode())
		}
		t.Fatalf("recipe: %v", err)
	}
	got := map[string]bool{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		got[sc.Text()] = true
	}
	for _, l := range shown {
		if !got[l] {
			t.Errorf("README shows %q, the recipe did not print it", l)
		}
	}
	for _, f := range leftovers {
		if _, err := os.Stat(filepath.Join(root, f)); err == nil && !before[f] {
			t.Errorf("the recipe left %s in the checkout", f)
		}
	}
}

// readmeSection returns the text from heading to the next "## " heading.
func readmeSection(doc, heading string) string {
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		return ""
	}
	rest := doc[i+len(heading)+2:]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}
