// Package pins is the Raft-replicated adapter pinning metadata of a prefixmesh cluster
// (docs/architecture.md, "Pins"): adapters (id, name, base model, revision), placement pins (adapter → the nodes the router may
// send it to) and prefix pins ((adapter, token prefix) → the nodes that must keep that prefix
// cached). The state machine (FSM) applies versioned, pre-validated binary commands
// deterministically; every entry's version is the Raft index of the write that last changed it,
// and compare-and-set compares that version. Snapshots only capture an immutable copy and
// are serialised with a CRC32-C trailer, which Restore checks before replacing everything. The Store
// runs hashicorp/raft over TCP (optionally TLS/mTLS) with raft-boltdb logs and file snapshots,
// forwards writes from followers to the leader over the PinsPeer gRPC service, serves reads locally
// with their staleness exposed (or linearizably through the leader's read index), and never stops
// serving reads when quorum is lost: only writes fail, with ErrUnavailable. Service exposes the Pins
// gRPC API; TableCopy keeps a read-only copy from a router's Watch stream for node agents, and
// Applier turns the node's prefix pins into PinPrefix/ReleaseMatched calls on its cache.
// Tests run real raft clusters on 127.0.0.1:0 with bolt stores in temporary directories. The
// porcupine linearizability test (CAS writes and linearizable reads under partitions and crashes)
// runs 12 s with 3 voters by default; `go test ./cluster/pins/ -run Linearizable -pins.long` runs
// 2 minutes with 3 voters and 1 minute with 5; `go test ./cluster/pins/ -run Figures -v
// -pins.figures` prints write latency and failover times.
package pins
