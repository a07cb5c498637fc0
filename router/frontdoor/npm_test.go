package frontdoor

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
)

// npmDir is where scripts/test.sh installs the pinned `openai` npm package (PREFIXMESH_NPM_DIR
// overrides it).
func npmDir(t *testing.T) string {
	if d := os.Getenv("PREFIXMESH_NPM_DIR"); d != "" {
		return d
	}
	d, err := filepath.Abs("../../.cache/npm")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The official `openai` npm client, driven against the front door over real simulated engines:
// completions with a batch, chat, streaming with usage, an abort mid-stream, models list and
// retrieve, and the error shapes (testdata/openai_client.cjs). Outside CI it is skipped when node
// or the package is missing; in CI (CI=true) that is a failure, as scripts/test.sh installs both.
func TestOpenAINodeClient(t *testing.T) {
	nodeBin, err := exec.LookPath("node")
	dir := filepath.Join(npmDir(t), "node_modules")
	_, statErr := os.Stat(filepath.Join(dir, "openai", "package.json"))
	if err != nil || statErr != nil {
		testenv.Missing(t, "node or the openai npm package in "+dir, errors.Join(err, statErr), "scripts/test.sh installs both")
	}
	eng := fastEngineConfig()
	eng.DecodeTokensPerSec = 2000 // the aborted stream of 1,000 tokens would take 0.5 s
	f := startFleet(t, fleetOpts{nodes: 2, engine: eng})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, "testdata/openai_client.cjs", f.srv.URL, simModel)
	cmd.Env = append(os.Environ(), "NODE_PATH="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
		t.Fatalf("openai npm client: %v\n%s", err, out)
	}
	// The aborted stream released its slot and counts as closed by the client.
	eventually(t, "the aborted stream to end", func() bool { return f.fd.InFlight() == 0 })
	eventually(t, "the aborted stream to count", func() bool {
		return counterValue(t, f.reg, "prefixmesh_frontdoor_broken_streams_total") >= 1
	})
}
