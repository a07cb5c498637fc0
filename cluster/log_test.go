package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/ratelog"
)

// lineCounter is a slog handler that records the lines it gets.
type lineCounter struct {
	mu    sync.Mutex
	lines []string
}

func (c *lineCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *lineCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, r.Level.String()+" "+r.Message)
	return nil
}
func (c *lineCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *lineCounter) WithGroup(string) slog.Handler      { return c }

func (c *lineCounter) count(substr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lines {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

func TestMemberlistLoggerLimits(t *testing.T) {
	var c lineCounter
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	w := &levelWriter{l: slog.New(&c), m: m, lim: ratelog.NewLimiter(logInterval, logBurst, func() time.Time { return now })}
	for i := 0; i < 1000; i++ {
		_, _ = w.Write([]byte("[ERR] memberlist: Decrypt packet failed: boom from=1.2.3.4:5\n"))
	}
	_, _ = w.Write([]byte("[INFO] memberlist: not limited\n"))
	if got := c.count("Decrypt"); got != logBurst {
		t.Fatalf("%d decrypt lines logged, want %d", got, logBurst)
	}
	if c.count("not limited") != 1 {
		t.Fatal("an INFO line was limited")
	}
	now = now.Add(logInterval)
	_, _ = w.Write([]byte("[ERR] memberlist: Decrypt packet failed: again\n"))
	if c.count("suppressed") != 1 || c.count("again") != 1 {
		t.Fatalf("after the interval: lines %v", c.lines[len(c.lines)-2:])
	}
	if v := counterValue(m.badPackets.WithLabelValues("decrypt")); v != 1001 {
		t.Fatalf("bad packets counted %v, want 1001", v)
	}
	if v := counterValue(m.logLines.WithLabelValues("ERROR")); v != 1001 {
		t.Fatalf("error lines counted %v, want 1001", v)
	}
}

// TestGarbagePacketsAreCountedNotLogged sends garbage and foreign-key packets to a real
// member's gossip port: it stays up, counts them, and logs a handful of lines, not one per
// packet.
func TestGarbagePacketsAreCountedNotLogged(t *testing.T) {
	var c lineCounter
	r := startRouter(t, "router-0", nil, func(cfg *Config) { cfg.Logger = slog.New(&c) })
	conn, err := net.Dial("udp", r.agent.GossipAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const packets = 2000
	buf := make([]byte, 200)
	for i := 0; i < packets; i++ {
		_, _ = rand.Read(buf)
		_, _ = conn.Write(buf)
	}
	// TCP garbage too (the push/pull stream path).
	for i := 0; i < 20; i++ {
		tc, err := net.Dial("tcp", r.agent.GossipAddr())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = tc.Write(bytes.Repeat([]byte{0xff}, 64))
		_ = tc.Close()
	}
	waitFor(t, settle, "packets counted", func() (bool, string) {
		n := counterValue(r.agent.metrics.logLines.WithLabelValues("ERROR"))
		// UDP on a loaded loopback may drop some; most must arrive and be counted.
		return n >= packets/4, "counted " + strconv.FormatFloat(n, 'f', 0, 64)
	})
	if got := c.count("ERROR"); got > 2*logBurst+2 {
		t.Fatalf("%d ERROR lines for %d garbage packets", got, packets)
	}
	t.Logf("%v error lines counted, %d logged", counterValue(r.agent.metrics.logLines.WithLabelValues("ERROR")), c.count("ERROR"))
	if h := r.agent.Health(); !h.OK {
		t.Fatalf("member unhealthy after garbage: %s", h.Reason)
	}
}
