package pins

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// mustWrite writes c, retrying while the cluster is unavailable: on a loaded machine a leader
// can miss its lease and step down mid-write, which is correct behaviour and not what these
// tests are about. A CAS retried after an unknown outcome counts as done when it finds its own
// effect (the version moved on to exactly the nodes it wrote).
func mustWrite(t testing.TB, s *Store, c Command) Result {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	retried := false
	for {
		r, err := s.Write(ctx, c)
		var ve *VersionError
		switch {
		case err == nil:
			return r
		case errors.Is(err, ErrUnavailable) && ctx.Err() == nil:
			retried = true
			continue
		case retried && errors.As(err, &ve) && c.Op == OpPinAdapter && s.Sync(ctx) == nil:
			if p, ok := s.fsm.Pin(c.AdapterID); ok && p.Version == ve.Current && slices.Equal(p.Nodes, normalizeNodes(c.Nodes)) {
				return Result{Index: p.Version, Version: p.Version}
			}
		}
		t.Fatalf("write %v on %s: %v", c.Op, s.ID(), err)
	}
}

func putAdapter(id uint64) Command {
	return Command{Op: OpPutAdapter, Adapter: Adapter{ID: id, Name: fmt.Sprintf("lora-%d", id), BaseModel: "llama-3-8b"}}
}

// snapshotBytes is a canonical serialisation of a member's table.
func snapshotBytes(s *Store) []byte {
	s.fsm.mu.RLock()
	defer s.fsm.mu.RUnlock()
	st := s.fsm.st.clone()
	st.applied = 0   // members may differ in how many no-op entries they applied
	st.servers = nil // leaders re-register their (new) gRPC addresses at their own pace
	return encodeSnapshot(&st)
}

func TestClusterFailoverAndForwarding(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("voters=%d", n), func(t *testing.T) {
			c := newCluster(t, n, nil)
			ld := c.leader(10 * time.Second)
			mustWrite(t, ld.store, putAdapter(1))

			// A write on a follower is forwarded to the leader.
			f := c.follower()
			r := mustWrite(t, f.store, Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"n2", "n1"}, Cond: IfVersion(0)})
			if err := f.store.Sync(ctxT(t, 5*time.Second)); err != nil {
				t.Fatalf("sync: %v", err)
			}
			nodes, pinned := f.store.AllowedNodes(1)
			if !pinned || fmt.Sprint(nodes) != "[n1 n2]" {
				t.Fatalf("AllowedNodes on follower = %v, %v", nodes, pinned)
			}
			// CAS with a stale version fails with the current one, through forwarding too.
			_, err := f.store.Write(ctxT(t, 5*time.Second), Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"n3"}, Cond: IfVersion(r.Version - 1)})
			var ve *VersionError
			if !errors.As(err, &ve) || ve.Current != r.Version {
				t.Fatalf("stale CAS: err %v, want VersionError current %d", err, r.Version)
			}

			// Crash the leader: the others elect a new one and keep the table.
			old := ld
			for i, nd := range c.nodes {
				if nd == old {
					c.kill(i)
				}
			}
			ld = c.leader(10 * time.Second)
			if ld == old {
				t.Fatal("dead leader still leads")
			}
			mustWrite(t, c.follower().store, Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"n3"}, Cond: IfVersion(r.Version)})
			c.waitConverged(10 * time.Second)
			// The new leader registered its gRPC address in the table, for forwarding.
			waitFor(t, 10*time.Second, "the leader's gRPC address in every table", func() bool {
				for _, nd := range c.live() {
					if addr, _ := nd.store.fsm.ServerAddr(ld.id); addr != ld.grpcAddr {
						return false
					}
				}
				return true
			})
			want := snapshotBytes(ld.store)
			for _, nd := range c.live() {
				if got := snapshotBytes(nd.store); !bytes.Equal(got, want) {
					t.Fatalf("%s's table differs from the leader's", nd.id)
				}
			}
		})
	}
}

func TestRestartFromSnapshotAndLog(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.SnapshotThreshold = 8; cfg.TrailingLogs = 4 })
	ld := c.leader(10 * time.Second)
	for i := uint64(1); i <= 20; i++ {
		mustWrite(t, ld.store, putAdapter(i))
	}
	if err := ld.store.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for i := uint64(1); i <= 5; i++ { // entries after the snapshot, replayed from the log
		mustWrite(t, ld.store, Command{Op: OpPinPrefix, AdapterID: i, Tokens: []uint32{1, 2, uint32(i)}, Nodes: []string{"n1"}})
	}
	c.waitConverged(10 * time.Second)
	want := snapshotBytes(ld.store)
	wantIdx := ld.store.fsm.AppliedIndex()

	// Restart every member: each comes back from its snapshot plus log.
	for i := range c.nodes {
		c.kill(i)
	}
	for i := range c.nodes {
		c.start(i, false)
	}
	c.leader(10 * time.Second)
	waitFor(t, 10*time.Second, "members to re-apply their logs", func() bool {
		for _, nd := range c.live() {
			if nd.store.fsm.AppliedIndex() < wantIdx {
				return false
			}
		}
		return true
	})
	for _, nd := range c.live() {
		if got := snapshotBytes(nd.store); !bytes.Equal(got, want) {
			t.Fatalf("%s after restart differs", nd.id)
		}
	}
}

func TestLaggingVoterCatchesUpBySnapshot(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.SnapshotThreshold = 16; cfg.TrailingLogs = 4 })
	ld := c.leader(10 * time.Second)
	lag := c.follower()
	others := []string{}
	for _, nd := range c.nodes {
		if nd != lag {
			others = append(others, nd.raftAddr)
		}
	}
	c.fault.partition(lag.raftAddr, others...)
	for i := uint64(1); i <= 60; i++ {
		mustWrite(t, ld.store, putAdapter(i))
	}
	if err := ld.store.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if first, _ := ld.store.bolt.FirstIndex(); first <= lag.store.fsm.AppliedIndex()+1 {
		t.Fatalf("leader's log still starts at %d; the lagging voter (at %d) could catch up from it", first, lag.store.fsm.AppliedIndex())
	}
	before := lag.store.fsm.Restores()
	c.fault.heal()
	c.waitConverged(10 * time.Second)
	if lag.store.fsm.Restores() == before {
		t.Fatal("lagging voter caught up without installing a snapshot")
	}
	if !bytes.Equal(snapshotBytes(lag.store), snapshotBytes(ld.store)) {
		t.Fatal("lagging voter's table differs after catching up")
	}
}

func TestQuorumLossStopsWritesNotReads(t *testing.T) {
	c := newCluster(t, 3, nil)
	ld := c.leader(10 * time.Second)
	mustWrite(t, ld.store, putAdapter(7))
	mustWrite(t, ld.store, Command{Op: OpPinAdapter, AdapterID: 7, Nodes: []string{"gpu-1"}})
	c.waitConverged(10 * time.Second)
	for i, nd := range c.nodes {
		if nd != ld {
			c.kill(i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := ld.store.Write(ctx, putAdapter(8))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write without quorum: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("write without quorum took %v; the deadline was 500ms", d)
	}
	// At the gRPC edge: UNAVAILABLE for writes and linearizable lists, local lists still served.
	svc := NewService(ld.store, nil)
	_, err = svc.PinAdapter(ctxT(t, 300*time.Millisecond), &pb.PinAdapterRequest{AdapterId: 7, Nodes: []string{"gpu-2"}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("gRPC write without quorum: %v, want Unavailable", err)
	}
	if _, err := svc.List(ctxT(t, 300*time.Millisecond), &pb.ListPinsRequest{Linearizable: true}); status.Code(err) != codes.Unavailable {
		t.Fatalf("linearizable List without quorum: %v, want Unavailable", err)
	}
	if l, err := svc.List(ctxT(t, time.Second), &pb.ListPinsRequest{}); err != nil || len(l.GetPins()) != 1 || l.GetStalenessSeconds() < 0 {
		t.Fatalf("local List without quorum: %v, %v", l, err)
	}
	if err := ld.store.Sync(ctxT(t, 300*time.Millisecond)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("linearizable read without quorum: %v, want ErrUnavailable", err)
	}
	if nodes, pinned := ld.store.AllowedNodes(7); !pinned || len(nodes) != 1 {
		t.Fatalf("local read without quorum: %v %v", nodes, pinned)
	}
	waitFor(t, 5*time.Second, "staleness to grow", func() bool { return ld.store.Staleness() > 100*time.Millisecond })
}

func TestDamagedSnapshotFileRefused(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig("solo", dir, "127.0.0.1:0")
	cfg.Bootstrap = true
	cfg.SnapshotRetain = 1
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "leader", s.IsLeader)
	mustWrite(t, s, putAdapter(1))
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if err := s.Shutdown(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*", "state.bin"))
	if len(files) != 1 {
		t.Fatalf("snapshots: %v", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(files[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	// Raft's own CRC64 over the file and our CRC32-C both catch this; either way the store must
	// refuse to start from it rather than serve a damaged table.
	cfg.Bootstrap = false
	s2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(context.Background()); err == nil {
		_ = s2.stop()
		t.Fatal("store started from a damaged snapshot")
	}
	// And the FSM alone refuses the damaged bytes.
	meta, rc := openSnapshotDir(t, filepath.Dir(files[0]))
	_ = meta
	if err := NewFSM().Restore(rc); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Restore of damaged snapshot: %v, want ErrCorrupt", err)
	}
}

func openSnapshotDir(t *testing.T, dir string) (*raft.SnapshotMeta, *os.File) {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "state.bin"))
	if err != nil {
		t.Fatal(err)
	}
	return nil, f
}

func TestGracefulShutdownTransfersLeadership(t *testing.T) {
	c := newCluster(t, 3, nil)
	ld := c.leader(10 * time.Second)
	mustWrite(t, ld.store, putAdapter(1))
	term := ld.store.raft.CurrentTerm()
	c.mu.Lock()
	ld.gs.Stop()
	ld.wg.Wait()
	if err := ld.store.Shutdown(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	ld.store = nil
	c.mu.Unlock()
	// LeadershipTransfer returns once the target took over, so a leader exists right away in
	// the next term (an election after a crash would first wait out ElectionTimeout).
	next := c.leader(10 * time.Second)
	if got := next.store.raft.CurrentTerm(); got != term+1 {
		t.Logf("new leader at term %d after %d (an election raced the transfer)", got, term)
	}
	mustWrite(t, next.store, putAdapter(2))
}
