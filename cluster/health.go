package cluster

import (
	"context"
	"fmt"
	"time"
)

// Health is what a member knows about its own place in the cluster. A member that was given
// seeds and knows no other member is isolated: it never joined (wrong key or label, seeds
// unreachable) or lost every peer, and its daemon reports NOT_SERVING with Reason rather than
// serve a view of a cluster of one.
type Health struct {
	OK      bool
	Reason  string // why not OK; empty when OK
	Members int    // live members, this one included
	Nodes   int    // live node members
	Routers int    // live router members (this one included if it is a router)
}

// joinWarnMax caps the interval between WARN lines of a member that keeps failing to join:
// the first failure is logged at once, then after 2, 4, 8… retries, at least once a minute.
const joinWarnMax = time.Minute

// Health reports whether this member is part of a cluster, with member counts. A member without
// seeds (the first of a cluster) is healthy alone.
func (a *Agent) Health() Health {
	h := Health{}
	a.knownMu.Lock()
	for _, k := range a.known {
		h.Members++
		switch k.meta.Role {
		case RoleNode:
			h.Nodes++
		case RoleRouter:
			h.Routers++
		}
	}
	a.knownMu.Unlock()
	a.mu.Lock()
	started, closed := a.started, a.closed
	a.mu.Unlock()
	switch {
	case !started || closed:
		h.Reason = "gossip not running"
	case len(a.cfg.Join) == 0 || h.Members > 1:
		h.OK = true
	case a.everJoined.Load():
		h.Reason = "lost every gossip peer; rejoining " + seedList(a.cfg.Join)
	default:
		h.Reason = "not joined to the gossip cluster (seeds " + seedList(a.cfg.Join) + ")"
		if e := a.lastJoinErr.Load(); e != nil {
			h.Reason += ": " + *e
		}
	}
	return h
}

// WatchHealth calls fn with the member's health now and after every change (polled every
// interval) until ctx ends. It runs in the caller's goroutine.
func (a *Agent) WatchHealth(ctx context.Context, interval time.Duration, fn func(Health)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last Health
	for first := true; ; first = false {
		if h := a.Health(); first || h != last {
			last = h
			fn(h)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func seedList(seeds []string) string {
	if len(seeds) == 1 {
		return seeds[0]
	}
	return fmt.Sprint(seeds)
}

// joinLogger decides which failed joins are logged at WARN: the first, then with doubling gaps
// up to joinWarnMax; the others go to DEBUG.
type joinLogger struct {
	failures int
	next     time.Time
	gap      time.Duration
}

// warn reports whether a failure at now is logged at WARN.
func (j *joinLogger) warn(now time.Time, retry time.Duration) bool {
	j.failures++
	if j.failures > 1 && now.Before(j.next) {
		return false
	}
	if j.gap == 0 {
		j.gap = retry
	}
	j.gap = min(2*j.gap, joinWarnMax)
	j.next = now.Add(j.gap)
	return true
}

// reset starts over after a success.
func (j *joinLogger) reset() { *j = joinLogger{} }
