package drills

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prefixmesh/prefixmesh/internal/addrfile"
)

// Bounds of every wait in the drills: generous for a loaded two-core CI machine, and each far
// below the test binary's timeout.
const (
	buildWait = 4 * time.Minute  // compiling both daemons from a cold cache
	startWait = 30 * time.Second // a daemon writing its addr file, a cluster settling
	exitWait  = 20 * time.Second // a drain (--drain-timeout 10s) plus margin
)

// fleet is the processes of one drill run, all killed when the test ends.
type fleet struct {
	t       *testing.T
	dir     string
	nodeBin string
	rtrBin  string
	key     string // gossip key file
	start   time.Time

	mu    sync.Mutex // guards procs, runs
	procs []*proc
	runs  int
}

// proc is one daemon process.
type proc struct {
	name     string
	cmd      *exec.Cmd
	logPath  string
	addrFile string
	addrs    map[string]string
	exited   chan struct{} // closed when the process has been reaped
	waitErr  error         // set before exited is closed
	stopped  bool          // SIGSTOPped (guarded by fleet.mu)
	launched time.Time
}

// buildBinaries compiles both daemons into dir (CGO off, as shipped).
func buildBinaries(t *testing.T, dir string) (node, router string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	node, router = filepath.Join(dir, "prefixmesh-node"), filepath.Join(dir, "prefixmesh-router")
	ctx, cancel := context.WithTimeout(context.Background(), buildWait)
	defer cancel()
	for bin, pkg := range map[string]string{node: "./cmd/node", router: "./cmd/router"} {
		cmd := exec.CommandContext(ctx, filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return node, router
}

func newFleet(t *testing.T) *fleet {
	dir := t.TempDir()
	f := &fleet{t: t, dir: dir, start: time.Now()}
	f.nodeBin, f.rtrBin = buildBinaries(t, dir)
	f.key = f.writeKey("gossip.key")
	t.Cleanup(f.killAll)
	return f
}

// writeKey writes a fresh random gossip key file and returns its path.
func (f *fleet) writeKey(name string) string {
	var k [16]byte
	if _, err := rand.Read(k[:]); err != nil {
		f.t.Fatal(err)
	}
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, []byte(base64.StdEncoding.EncodeToString(k[:])+"\n"), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return p
}

// launch starts bin with args plus --addr-file and waits for the addr file.
func (f *fleet) launch(name, bin string, args ...string) *proc {
	f.t.Helper()
	f.mu.Lock()
	f.runs++
	run := f.runs
	f.mu.Unlock()
	p := &proc{name: name, exited: make(chan struct{}),
		addrFile: filepath.Join(f.dir, fmt.Sprintf("%s-%d.addrs", name, run)),
		logPath:  filepath.Join(f.dir, fmt.Sprintf("%s-%d.log", name, run))}
	logf, err := os.Create(p.logPath)
	if err != nil {
		f.t.Fatal(err)
	}
	p.cmd = exec.Command(bin, append(args, "--addr-file="+p.addrFile)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		_ = logf.Close()
		f.t.Fatalf("start %s: %v", name, err)
	}
	p.launched = time.Now()
	go func() {
		p.waitErr = p.cmd.Wait()
		_ = logf.Close()
		close(p.exited)
	}()
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	deadline := time.Now().Add(startWait)
	for {
		a, err := addrfile.Read(p.addrFile)
		if err == nil {
			p.addrs = a
			return p
		}
		select {
		case <-p.exited:
			f.t.Fatalf("%s exited before listening: %v\n%s", name, p.waitErr, p.log())
		default:
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s wrote no addr file within %v: %v\n%s", name, startWait, err, p.log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// log returns the process's output so far (for failure messages).
func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 8000 {
		b = append([]byte("…"), b[len(b)-8000:]...)
	}
	return string(b)
}

func (f *fleet) signal(p *proc, sig syscall.Signal) {
	f.t.Helper()
	f.mu.Lock()
	switch sig {
	case syscall.SIGSTOP:
		p.stopped = true
	case syscall.SIGCONT:
		p.stopped = false
	}
	f.mu.Unlock()
	if err := p.cmd.Process.Signal(sig); err != nil {
		f.t.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
}

// waitExit waits (bounded) for p to exit and returns its error (nil for status 0).
func (f *fleet) waitExit(p *proc, within time.Duration) error {
	f.t.Helper()
	select {
	case <-p.exited:
		return p.waitErr
	case <-time.After(within):
		f.t.Fatalf("%s still running %v after the signal\n%s", p.name, within, p.log())
		return nil
	}
}

// killAll kills every process still running (continuing stopped ones first) and reaps them.
func (f *fleet) killAll() {
	f.mu.Lock()
	procs := f.procs
	f.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.exited:
			continue
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
	}
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-time.After(exitWait):
			f.t.Errorf("%s not reaped within %v of SIGKILL", p.name, exitWait)
		}
	}
}

// since is the time since the fleet started, for logs.
func (f *fleet) since() string { return time.Since(f.start).Round(time.Millisecond).String() }

// eventually polls check every 10 ms until it returns nil or within passes.
func eventually(t *testing.T, within time.Duration, what string, check func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		err := check()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dial opens a gRPC client connection for the rest of the test.
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// httpGet returns a GET's status and body, bounded by a short deadline.
func httpGet(url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for b.Len() < 4<<20 {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String(), nil
}

// metricValue returns the value of the first sample line of /metrics that starts with series
// (a name with its labels, as Prometheus prints them), or an error.
func metricValue(body, series string) (float64, error) {
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			_, err := fmt.Sscan(rest, &v)
			return v, err
		}
	}
	return 0, errors.New("no series " + series)
}
