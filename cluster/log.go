package cluster

import (
	"bytes"
	"context"
	"log"
	"log/slog"

	"github.com/prefixmesh/prefixmesh/internal/ratelog"
)

// Outsiders can make memberlist log: every garbage, foreign-key or foreign-label packet that
// reaches the gossip port writes one "[ERR] memberlist: …" line (4,000 packets gave 3,988 lines
// in a probe). Warnings and errors are therefore counted (prefixmesh_gossip_log_lines_total, and
// prefixmesh_gossip_bad_packets_total for the packet faults) and logged at most logBurst per
// level per logInterval; the suppressed lines are summarised once the interval ends.
const (
	logInterval = ratelog.Interval
	logBurst    = ratelog.Burst
)

// newMemberlistLogger adapts memberlist's "[LEVEL] memberlist: …" lines to slog levels, with
// the limit above. m may be nil (nothing counted).
func newMemberlistLogger(l *slog.Logger, m *metrics) *log.Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return log.New(&levelWriter{l: l, m: m, lim: ratelog.NewLimiter(logInterval, logBurst, nil)}, "", 0)
}

type levelWriter struct {
	l   *slog.Logger
	m   *metrics
	lim *ratelog.Limiter // keyed by level
}

func (w *levelWriter) Write(p []byte) (int, error) {
	msg := bytes.TrimSpace(p)
	level := slog.LevelDebug
	switch {
	case bytes.HasPrefix(msg, []byte("[ERR]")):
		level, msg = slog.LevelError, msg[5:]
	case bytes.HasPrefix(msg, []byte("[WARN]")):
		level, msg = slog.LevelWarn, msg[6:]
	case bytes.HasPrefix(msg, []byte("[INFO]")):
		level, msg = slog.LevelInfo, msg[6:]
	case bytes.HasPrefix(msg, []byte("[DEBUG]")):
		msg = msg[7:]
	}
	msg = bytes.TrimSpace(msg)
	if level >= slog.LevelWarn {
		if w.m != nil {
			w.m.logLines.WithLabelValues(level.String()).Inc()
			if kind := badPacketKind(msg); kind != "" {
				w.m.badPackets.WithLabelValues(kind).Inc()
			}
		}
		if !w.allow(level) {
			return len(p), nil
		}
	}
	if w.l.Enabled(context.Background(), level) {
		w.l.Log(context.Background(), level, string(msg))
	}
	return len(p), nil
}

// allow reports whether a line at level may be logged now; it logs the summary of the previous
// window when a new one starts.
func (w *levelWriter) allow(level slog.Level) bool {
	ok, suppressed := w.lim.Allow(level.String())
	if suppressed > 0 {
		w.l.Log(context.Background(), level, "memberlist lines suppressed (rate limit; see prefixmesh_gossip_log_lines_total)",
			"suppressed", suppressed, "interval", logInterval)
	}
	return ok
}

// badPacketKind names the outsider-triggerable packet and stream faults memberlist reports, or
// "" for any other line. The set is fixed so the metric's labels stay bounded.
func badPacketKind(msg []byte) string {
	switch {
	case bytes.Contains(msg, []byte("ecrypt")): // "Decrypt packet failed", "no installed keys could decrypt"
		return "decrypt"
	case bytes.Contains(msg, []byte("label")):
		return "label"
	case bytes.Contains(msg, []byte("checksum")):
		return "checksum"
	case bytes.Contains(msg, []byte("ecode")), bytes.Contains(msg, []byte("ecompress")),
		bytes.Contains(msg, []byte("not supported")), bytes.Contains(msg, []byte("invalid msgType")),
		bytes.Contains(msg, []byte("missing message type")):
		return "decode"
	case bytes.Contains(msg, []byte("failed to receive")), bytes.Contains(msg, []byte("Failed to receive")):
		return "stream"
	}
	return ""
}
