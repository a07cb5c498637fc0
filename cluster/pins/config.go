package pins

import (
	"crypto/tls"
	"errors"
	"io"
	"os"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// Config configures a Store. Map flags 1:1 onto it in cmd/.
type Config struct {
	ServerID      string // raft server id: the router's node id; required
	DataDir       string // bolt log ("raft.db") and snapshots ("snapshots/"); required
	RaftBind      string // listen address, e.g. "0.0.0.0:7300"; port 0 picks a free one
	RaftAdvertise string // address others dial; default: the listener's (must not be 0.0.0.0)
	GRPCAddr      string // this member's Pins gRPC address, registered for forwarding
	Bootstrap     bool   // start a new one-voter cluster if DataDir holds no state
	// Peers maps raft server ids to gRPC addresses known from config (Reconcile adds more).
	Peers map[string]string
	// Voters is how many voters Reconcile keeps: 3 survives one failure, 5 survives two.
	Voters int

	// ServerTLS/ClientTLS enable TLS on the raft transport (both or neither); set ClientAuth
	// and client certificates for mTLS.
	ServerTLS, ClientTLS *tls.Config
	// PeerDialOptions are the gRPC options for forwarding to the leader (credentials).
	// Default: insecure, which suits loopback and meshes that encrypt below gRPC.
	PeerDialOptions []grpc.DialOption

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	SnapshotThreshold  uint64
	SnapshotInterval   time.Duration
	TrailingLogs       uint64
	SnapshotRetain     int
	MaxPool            int
	TransportTimeout   time.Duration
	// WriteTimeout bounds writes and linearizable reads whose context has no deadline.
	WriteTimeout time.Duration

	LogOutput  io.Writer // raft's log; default os.Stderr
	LogLevel   string    // hclog level; default "warn"
	Registerer prometheus.Registerer
	// WrapStream, when set, wraps the raft stream layer (fault injection in tests).
	WrapStream func(raft.StreamLayer) raft.StreamLayer
}

// DefaultConfig returns the production defaults; set ServerID, DataDir and RaftBind.
func DefaultConfig() Config {
	return Config{
		Voters: 3, // survives one voter failure; pins change rarely, so more buys little
		// raft's own defaults, tuned for a LAN: 1 s heartbeat/election, 500 ms lease.
		HeartbeatTimeout:   time.Second,
		ElectionTimeout:    time.Second,
		LeaderLeaseTimeout: 500 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		// Pins are few and small: snapshot after 1024 entries and keep 1024 for followers that
		// lag briefly (a restart), so they catch up from the log rather than a snapshot.
		SnapshotThreshold: 1024,
		SnapshotInterval:  2 * time.Minute,
		TrailingLogs:      1024,
		SnapshotRetain:    2,                // one spare in case the latest is damaged
		MaxPool:           3,                // raft's suggestion for pipelining
		TransportTimeout:  10 * time.Second, // raft's suggestion; also bounds snapshot sends
		WriteTimeout:      5 * time.Second,  // a few elections: long enough to ride a failover
		LogOutput:         os.Stderr,
		LogLevel:          "warn",
	}
}

// Validate checks a Config.
func (c *Config) Validate() error {
	switch {
	case c.ServerID == "":
		return errors.New("pins config: ServerID is required")
	case c.DataDir == "":
		return errors.New("pins config: DataDir is required")
	case c.RaftBind == "":
		return errors.New("pins config: RaftBind is required")
	case (c.ServerTLS == nil) != (c.ClientTLS == nil):
		return errors.New("pins config: set both ServerTLS and ClientTLS, or neither")
	case c.Voters < 1:
		return errors.New("pins config: Voters must be at least 1")
	case c.HeartbeatTimeout <= 0 || c.ElectionTimeout <= 0 || c.LeaderLeaseTimeout <= 0 || c.CommitTimeout <= 0:
		return errors.New("pins config: raft timeouts must be positive")
	case c.LeaderLeaseTimeout > c.HeartbeatTimeout:
		return errors.New("pins config: LeaderLeaseTimeout must not exceed HeartbeatTimeout")
	case c.SnapshotRetain < 1 || c.MaxPool < 1 || c.TransportTimeout <= 0 || c.WriteTimeout <= 0:
		return errors.New("pins config: SnapshotRetain, MaxPool, TransportTimeout and WriteTimeout must be positive")
	case c.LogOutput == nil:
		return errors.New("pins config: LogOutput is required (io.Discard to drop)")
	}
	return nil
}
