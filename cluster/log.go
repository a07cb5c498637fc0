package cluster

import (
	"bytes"
	"context"
	"log"
	"log/slog"
)

// newMemberlistLogger adapts memberlist's "[LEVEL] memberlist: …" lines to slog levels.
func newMemberlistLogger(l *slog.Logger) *log.Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return log.New(levelWriter{l}, "", 0)
}

type levelWriter struct{ l *slog.Logger }

func (w levelWriter) Write(p []byte) (int, error) {
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
	if w.l.Enabled(context.Background(), level) {
		w.l.Log(context.Background(), level, string(bytes.TrimSpace(msg)))
	}
	return len(p), nil
}
