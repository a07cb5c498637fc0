// Package drills holds the fault drills as a Go test: it builds the real
// prefixmesh-node and prefixmesh-router binaries, starts four node agents (simulated engines) and
// three routers (the Raft voters) as processes on loopback, all on ports the OS picks (read back
// from --addr-file), drives bounded streaming load through the routers' front doors, and then, one
// after another: kills a node with SIGKILL, restarts it, drains one with SIGTERM, freezes one with
// SIGSTOP (when the router has a first-byte deadline), freezes the Raft leader with SIGSTOP and
// then kills the (new) leader with SIGKILL, each time writing a pin through a follower, and starts
// a node with the wrong gossip key. Each drill prints what it measured and asserts its
// target with a generous margin (docs/operations.md lists the figures). Beside the drills
// (prometheus_test.go), a real Prometheus scrapes a cluster of the same processes (two routers,
// engines publishing KV events with agents mirroring them, the endpoint picker) after traffic
// through all three doors, and every query of the shipped dashboard and every alert's signals
// must return data, so a renamed metric fails here. The package has no non-test code; `go test ./internal/drills/` runs the drills (under a minute once built, on a
// loaded two-core machine), and -short skips them.
package drills
