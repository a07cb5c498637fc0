package agentd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestAgentRestartRecoveryFigures measures, over real processes, how soon a mirroring agent's
// estimates are exact again after it is killed (SIGKILL, as an OOM kill) and restarted while the
// engine keeps serving. Load: one client sending, back to back, a shared 64-block system prompt
// (1,024 tokens) plus a suffix: a new one (70%) or one of the last 20 sent (30%), on a simulated
// engine whose 2,048-block pool evicts. For each request the agent's estimate (its mirror's match
// through vLLM's cached-tokens rule) is taken just before the request and compared with the
// cached_tokens the engine reports. The agent is killed after 6 s of load, restarted 2 s later,
// and the share of exact requests is reported per window after the restart, three ways: with
// --state-dir and the engine's replay socket, with --state-dir and no replay, and with neither
// (the baseline). Over-credits (an estimate above cached_tokens: a block credited that the
// engine did not hold) are counted too.
// It takes about four minutes: run it with PREFIXMESH_RESTART_FIGURES=1.
func TestAgentRestartRecoveryFigures(t *testing.T) {
	if os.Getenv("PREFIXMESH_RESTART_FIGURES") == "" {
		t.Skip("set PREFIXMESH_RESTART_FIGURES=1 to measure (about four minutes)")
	}
	bin := buildNode(t)
	windows := []time.Duration{5 * time.Second, 10 * time.Second, 30 * time.Second, 60 * time.Second}
	for _, mode := range []struct {
		name            string
		replay, ckpoint bool
		target          float64 // share exact required in the 10–30 s window
	}{
		{"state dir, replay", true, true, 0.95},
		{"state dir, no replay", false, true, 0.95},
		{"no state dir, no replay", false, false, 0}, // the baseline: nothing recovers the system prompt
	} {
		t.Run(mode.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			simArgs := []string{"--node-id=engine", "--kv-blocks=2048", "--sim-prefill-tokens-per-s=1e9", "--sim-decode-tokens-per-s=1e9",
				"--sim-kv-events=tcp://127.0.0.1:0"}
			if mode.replay {
				simArgs = append(simArgs, "--sim-kv-events-replay=tcp://127.0.0.1:0")
			}
			sim := startProc(t, ctx, bin, simArgs)
			agArgs := []string{"--node-id=agent", "--engine=vllm", "--engine-url=http://" + sim["http"], "--kv-events=" + sim["kvevents"]}
			if mode.replay {
				agArgs = append(agArgs, "--kv-events-replay="+sim["kvevents_replay"])
			}
			if mode.ckpoint {
				agArgs = append(agArgs, "--state-dir="+filepath.Join(t.TempDir(), "state"))
			}

			rng := rand.New(rand.NewPCG(1, 2))
			sys := make([]uint32, 1024)
			for i := range sys {
				sys[i] = uint32(100000 + i)
			}
			var recent [][]uint32
			next := func() []uint32 {
				if len(recent) > 0 && rng.IntN(10) < 3 {
					return recent[rng.IntN(len(recent))]
				}
				p := append(append([]uint32(nil), sys...), make([]uint32, 64+rng.IntN(128))...)
				for i := len(sys); i < len(p); i++ {
					p[i] = uint32(rng.IntN(50000))
				}
				recent = append(recent, p)
				if len(recent) > 20 {
					recent = recent[1:]
				}
				return p
			}
			type outcome struct {
				at          time.Duration // since the restart
				exact, over bool
			}
			var outs []outcome
			run := func(mc pb.NodeCacheClient, until time.Time, t0 time.Time, record bool) {
				for time.Now().Before(until) {
					p := next()
					est := -1
					if mc != nil {
						rctx, rcancel := context.WithTimeout(ctx, time.Second)
						r, err := mc.PeekMatchedTokens(rctx, &pb.PeekMatchedTokensRequest{Tokens: p, BlockSize: 16})
						rcancel()
						if err == nil {
							est = local.EngineCachedTokens(int(r.GetMatchedTokens()), len(p), 16)
						}
					}
					cached := complete(t, sim["http"], p)
					if record {
						outs = append(outs, outcome{time.Since(t0), est == cached, est > cached})
					}
				}
			}

			ag, cmd := startProcCmd(t, ctx, bin, agArgs)
			run(pb.NewNodeCacheClient(dial(t, ag["grpc"])), time.Now().Add(6*time.Second), time.Time{}, false)
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			run(nil, time.Now().Add(2*time.Second), time.Time{}, false) // the engine serves on, the agent is down
			t0 := time.Now()
			ag, _ = startProcCmd(t, ctx, bin, agArgs)
			run(pb.NewNodeCacheClient(dial(t, ag["grpc"])), t0.Add(windows[len(windows)-1]), t0, true)

			var line []string
			over := 0
			for _, o := range outs {
				if o.over {
					over++
				}
			}
			from := time.Duration(0)
			var share10to30 float64
			for _, w := range windows {
				n, ok := 0, 0
				for _, o := range outs {
					if o.at >= from && o.at < w {
						n++
						if o.exact {
							ok++
						}
					}
				}
				share := 0.0
				if n > 0 {
					share = float64(ok) / float64(n)
				}
				if w == 30*time.Second {
					share10to30 = share
				}
				line = append(line, fmt.Sprintf("%v–%v: %.1f%% of %d", from, w, 100*share, n))
				from = w
			}
			t.Logf("%s: exact after the restart: %s; over-credited: %d of %d", mode.name, strings.Join(line, ", "), over, len(outs))
			if share10to30 < mode.target {
				t.Errorf("%s: %.1f%% exact 10–30 s after the restart, want ≥ %.0f%%", mode.name, 100*share10to30, 100*mode.target)
			}
		})
	}
}
