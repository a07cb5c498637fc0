package agentd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/node/kvevents"
)

// With --state-dir, a mirroring agent checkpoints its mirror and each rank's position in the
// engine's stream every checkpointInterval and when it stops, and a restarted agent starts from
// the checkpoint (kvevents.ReadCheckpoint; the follower then replays the gap or keeps the mirror
// as a partial one with provisional copies). The file is written to a temporary name and
// renamed, so a crash mid-write leaves the previous checkpoint.
const (
	checkpointFile = "kvevents-mirror.ckpt"
	// checkpointInterval: 5 s, so an agent killed without warning (an OOM kill) restarts at most
	// 5 s behind, well inside vLLM's 10,000-batch replay buffer under load.
	checkpointInterval = 5 * time.Second
)

// loadMirror returns the mirror to follow the engine with: the checkpoint's under --state-dir
// when there is a usable one (with the checkpoint), else an empty one.
func loadMirror(cfg Config, logger *slog.Logger) (*kvevents.CacheMirror, *kvevents.Checkpoint) {
	if cfg.StateDir == "" {
		return kvevents.NewCacheMirror(cfg.BlockSize), nil
	}
	path := filepath.Join(cfg.StateDir, checkpointFile)
	f, err := os.Open(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			logger.Warn("kv events checkpoint unreadable: starting empty", "path", path, "err", err)
		}
		return kvevents.NewCacheMirror(cfg.BlockSize), nil
	}
	defer f.Close()
	m, ck, err := kvevents.ReadCheckpoint(f, cfg.BlockSize, cfg.DPSize)
	if err != nil {
		logger.Warn("kv events checkpoint refused: starting empty", "path", path, "err", err)
		return kvevents.NewCacheMirror(cfg.BlockSize), nil
	}
	s := m.MirrorStats()
	logger.Info("kv events mirror restored from the checkpoint", "path", path, "blocks", s.Blocks, "visible", s.Visible)
	return m, &ck
}

// checkpointer writes the mirror's checkpoint periodically and once more at close.
type checkpointer struct {
	path    string
	dpSize  int
	mirror  *kvevents.CacheMirror
	started func() float64
	log     *slog.Logger
	writes  *prometheus.CounterVec
	buf     []byte
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func startCheckpointer(ctx context.Context, cfg Config, mirror *kvevents.CacheMirror, started func() float64, log *slog.Logger, reg prometheus.Registerer) (*checkpointer, error) {
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	c := &checkpointer{path: filepath.Join(cfg.StateDir, checkpointFile), dpSize: cfg.DPSize, mirror: mirror, started: started, log: log,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixmesh_kvevents_checkpoint_writes_total",
			Help: "Checkpoints of the mirror written to --state-dir, by result (ok, error)."}, []string{"result"})}
	if err := reg.Register(c.writes); err != nil {
		return nil, err
	}
	ctx, c.cancel = context.WithCancel(ctx)
	c.wg.Go(func() {
		t := time.NewTicker(checkpointInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.write()
			}
		}
	})
	return c, nil
}

// close stops the periodic writes and writes the final checkpoint.
func (c *checkpointer) close() {
	c.cancel()
	c.wg.Wait()
	c.write()
}

func (c *checkpointer) write() {
	c.buf = c.mirror.AppendCheckpoint(c.buf[:0], c.dpSize, c.started())
	err := writeFileAtomic(c.path, c.buf)
	if err != nil {
		c.writes.WithLabelValues("error").Inc()
		c.log.Warn("kv events checkpoint", "path", c.path, "err", err)
		return
	}
	c.writes.WithLabelValues("ok").Inc()
}

// writeFileAtomic writes data to path through a temporary file in the same directory, synced and
// renamed over path.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	_, err = bytes.NewReader(data).WriteTo(tmp)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return err
}
