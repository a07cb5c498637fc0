// Package ratelog limits log lines that outsiders can cause (a garbage packet, a failed TLS
// handshake: one line each, as many as anyone cares to send) to a few per interval, and counts
// them all. Limiter is the decision; ErrorLog applies it to a net/http server's
// ErrorLog.
package ratelog

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults: at most Burst lines per Interval per key; an operator sees that something is wrong
// and what, at a cost of at most 30 lines a minute per key.
const (
	Interval = 10 * time.Second
	Burst    = 5
)

// Limiter allows at most burst lines per interval and key. Keys should be a small fixed set
// (log levels, a server's name): each holds a window.
type Limiter struct {
	interval time.Duration
	burst    int
	now      func() time.Time

	mu      sync.Mutex // guards windows
	windows map[string]*window
}

type window struct {
	start      time.Time
	logged     int
	suppressed int
}

// NewLimiter returns a limiter of burst lines per interval; now nil means time.Now.
func NewLimiter(interval time.Duration, burst int, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{interval: interval, burst: burst, now: now, windows: map[string]*window{}}
}

// Allow reports whether a line for key may be logged now, and, when a new window starts, how
// many lines the previous one suppressed (to be reported once).
func (l *Limiter) Allow(key string) (ok bool, suppressedBefore int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.windows[key]
	if w == nil {
		w = &window{start: now}
		l.windows[key] = w
	}
	if now.Sub(w.start) >= l.interval {
		suppressedBefore = w.suppressed
		*w = window{start: now}
	}
	if w.logged < l.burst {
		w.logged++
		return true, suppressedBefore
	}
	w.suppressed++
	return false, suppressedBefore
}

// ErrorLog returns a *log.Logger for http.Server.ErrorLog: every line (a failed TLS handshake, a
// malformed request net/http could not answer) is counted in prefixmesh_http_server_errors_total,
// registered on reg (nil: not registered), and at most Burst per Interval are logged at WARN on
// logger, the rest summarised.
func ErrorLog(logger *slog.Logger, reg prometheus.Registerer) (*log.Logger, error) {
	lines := prometheus.NewCounter(prometheus.CounterOpts{Name: "prefixmesh_http_server_errors_total",
		Help: "Lines the HTTP server logged about connections it could not serve (TLS handshakes, bad requests), logged or suppressed by the rate limit."})
	if reg != nil {
		if err := reg.Register(lines); err != nil {
			return nil, err
		}
	}
	return newErrorLog(logger, lines), nil
}

func newErrorLog(logger *slog.Logger, lines prometheus.Counter) *log.Logger {
	return log.New(&errorWriter{l: logger, lines: lines, lim: NewLimiter(Interval, Burst, nil)}, "", 0)
}

type errorWriter struct {
	l     *slog.Logger
	lines prometheus.Counter
	lim   *Limiter
}

func (w *errorWriter) Write(p []byte) (int, error) {
	if w.lines != nil {
		w.lines.Inc()
	}
	ok, suppressed := w.lim.Allow("")
	if suppressed > 0 {
		w.l.Warn("http server lines suppressed (rate limit)", "suppressed", suppressed, "interval", Interval)
	}
	if ok {
		w.l.Log(context.Background(), slog.LevelWarn, string(bytes.TrimSpace(p)))
	}
	return len(p), nil
}
