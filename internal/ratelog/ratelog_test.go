package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestLimiter(t *testing.T) {
	now := time.Unix(0, 0)
	l := NewLimiter(10*time.Second, 3, func() time.Time { return now })
	allowed := 0
	for range 100 {
		if ok, _ := l.Allow("a"); ok {
			allowed++
		}
	}
	if ok, _ := l.Allow("b"); !ok || allowed != 3 {
		t.Fatalf("allowed %d of key a (want 3); key b refused", allowed)
	}
	now = now.Add(10 * time.Second)
	ok, suppressed := l.Allow("a")
	if !ok || suppressed != 97 {
		t.Fatalf("new window: ok %v, suppressed %d (want 97)", ok, suppressed)
	}
}

func TestErrorLog(t *testing.T) {
	var buf bytes.Buffer
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x", Help: "x"})
	lg := newErrorLog(slog.New(slog.NewTextHandler(&buf, nil)), c)
	for range 50 {
		lg.Printf("http: TLS handshake error from 1.2.3.4:5: EOF")
	}
	var m dto.Metric
	_ = c.Write(&m)
	if n := strings.Count(buf.String(), "TLS handshake error"); n != Burst || m.GetCounter().GetValue() != 50 {
		t.Fatalf("%d lines logged, %v counted; want %d and 50", n, m.GetCounter().GetValue(), Burst)
	}
}
