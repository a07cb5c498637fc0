package cluster

import (
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// Config configures an Agent. Start from DefaultConfig.
type Config struct {
	// Meta describes this member. Role and NodeID are required; Epoch 0 picks a random one.
	Meta Meta

	// BindAddr and BindPort are where gossip listens (UDP and TCP on the same port); port 0 lets
	// the OS choose (see Agent.GossipAddr). AdvertiseAddr/Port override what peers are told.
	BindAddr      string
	BindPort      int
	AdvertiseAddr string
	AdvertisePort int

	// Join lists seeds: "host:port", "host" (BindPort), or "dns+srv:NAME" for the SRV records of a
	// headless service. Host names resolve to every A/AAAA address.
	Join []string
	// JoinRetryInterval is how often a member that knows no other member retries Join: pods of a
	// StatefulSet start in any order, so the first attempt often finds nobody.
	JoinRetryInterval time.Duration

	// Keys are AES keys of 16, 24 or 32 bytes, the first used to encrypt, all tried to decrypt
	// (rotation). Empty requires InsecureGossip.
	Keys [][]byte
	// InsecureGossip allows plaintext gossip when Keys is empty. Never in production.
	InsecureGossip bool
	// Label is bound into every packet (and the AES-GCM data): clusters sharing a network with
	// different labels ignore each other even with the same key.
	Label string

	// PublishInterval is how often a node polls its journal: the floor of insert-to-router delay,
	// while at 20 ms an idle node sends nothing and a busy one at most 50 packets/s per router.
	PublishInterval time.Duration
	// LoadInterval is how often a node checks its load and sends it if it changed (routers read load
	// at most 200 ms old while it changes: docs/architecture.md).
	LoadInterval time.Duration
	// HeartbeatInterval is how often a node sends its state even if nothing changed, so that a
	// router that lost the last delta of a quiet node notices within about a second.
	HeartbeatInterval time.Duration

	// ReorderWindow is how long a router holds a delta that arrived ahead of a missing one before
	// it gives up waiting and repairs; LAN reordering is sub-millisecond, this covers scheduling.
	ReorderWindow time.Duration
	// LagTimeout is how long a router may stay behind a sequence the node (or another router)
	// reported before it repairs: in-flight deltas arrive far sooner.
	LagTimeout time.Duration
	// SilenceTimeout is how long without any packet from a live node before a router repairs
	// (five heartbeats).
	SilenceTimeout time.Duration
	// TickInterval is the router's timer resolution for the timeouts above.
	TickInterval time.Duration

	// RepairTimeout bounds one GetSummary pull; RepairConcurrency bounds parallel pulls (a
	// router joining a large fleet must not open hundreds of streams at once); failed repairs
	// back off from RepairBackoff doubling up to MaxRepairBackoff.
	RepairTimeout     time.Duration
	RepairConcurrency int
	RepairBackoff     time.Duration
	MaxRepairBackoff  time.Duration

	// InboxSize bounds the router's queue of received packets (at most ~10 MiB at 1,300 bytes);
	// a full inbox drops and counts, and the sequence check repairs what was lost.
	InboxSize int
	// MaxHeldDeltas bounds the deltas held per node while waiting for a gap or a repair.
	MaxHeldDeltas int

	// LeaveTimeout bounds the graceful leave broadcast on Close.
	LeaveTimeout time.Duration
	// Profile picks memberlist's timing: "lan" (default), "wan" or "local" (fast, for tests
	// and a single host).
	Profile string

	// Logger receives the agent's and memberlist's logs; nil discards them.
	Logger *slog.Logger
	// Registry receives the agent's metrics; nil means a private registry.
	Registry prometheus.Registerer

	// tune, when set by tests, adjusts the memberlist config last.
	tune func(*memberlist.Config)
}

// DefaultConfig returns the defaults for a member of role with id nodeID.
func DefaultConfig(role Role, nodeID string) Config {
	return Config{
		Meta:              Meta{Role: role, NodeID: nodeID},
		BindAddr:          "0.0.0.0",
		BindPort:          7946, // memberlist's default port
		JoinRetryInterval: time.Second,
		Label:             DefaultLabel,
		PublishInterval:   20 * time.Millisecond,
		LoadInterval:      200 * time.Millisecond,
		HeartbeatInterval: time.Second,
		ReorderWindow:     100 * time.Millisecond,
		LagTimeout:        time.Second,
		SilenceTimeout:    5 * time.Second,
		TickInterval:      25 * time.Millisecond,
		RepairTimeout:     10 * time.Second,
		RepairConcurrency: 8,
		RepairBackoff:     100 * time.Millisecond,
		MaxRepairBackoff:  5 * time.Second,
		InboxSize:         8192,
		MaxHeldDeltas:     1024,
		LeaveTimeout:      2 * time.Second,
		Profile:           "lan",
	}
}

// Validate reports the first problem with c.
func (c *Config) Validate() error {
	if c.Meta.Role != RoleNode && c.Meta.Role != RoleRouter {
		return fmt.Errorf("cluster config: %w: role %d", ErrInvalid, c.Meta.Role)
	}
	if c.Meta.NodeID == "" || len(c.Meta.NodeID) > MaxNodeIDBytes {
		return fmt.Errorf("cluster config: %w: node id %q (1 to %d bytes)", ErrInvalid, c.Meta.NodeID, MaxNodeIDBytes)
	}
	if _, err := c.Meta.MarshalBinary(); err != nil {
		return fmt.Errorf("cluster config: %w", err)
	}
	if c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return fmt.Errorf("cluster config: %w: port out of range", ErrInvalid)
	}
	if len(c.Keys) == 0 && !c.InsecureGossip {
		return fmt.Errorf("cluster config: %w: no gossip key (give a key file, or allow plaintext explicitly with insecure gossip)", ErrInvalid)
	}
	for i, k := range c.Keys {
		if err := memberlist.ValidateKey(k); err != nil {
			return fmt.Errorf("cluster config: %w: key %d: %v", ErrInvalid, i, err)
		}
	}
	if len(c.Label) > memberlist.LabelMaxSize {
		return fmt.Errorf("cluster config: %w: label of %d bytes (max %d)", ErrInvalid, len(c.Label), memberlist.LabelMaxSize)
	}
	for name, d := range map[string]time.Duration{
		"publish interval": c.PublishInterval, "load interval": c.LoadInterval,
		"heartbeat interval": c.HeartbeatInterval, "reorder window": c.ReorderWindow,
		"lag timeout": c.LagTimeout, "silence timeout": c.SilenceTimeout, "tick interval": c.TickInterval,
		"repair timeout": c.RepairTimeout, "repair backoff": c.RepairBackoff,
		"max repair backoff": c.MaxRepairBackoff, "leave timeout": c.LeaveTimeout,
		"join retry interval": c.JoinRetryInterval,
	} {
		if d <= 0 {
			return fmt.Errorf("cluster config: %w: %s %v must be positive", ErrInvalid, name, d)
		}
	}
	if c.SilenceTimeout <= c.HeartbeatInterval {
		return fmt.Errorf("cluster config: %w: silence timeout %v must exceed the heartbeat interval %v", ErrInvalid, c.SilenceTimeout, c.HeartbeatInterval)
	}
	if c.RepairConcurrency <= 0 || c.InboxSize <= 0 || c.MaxHeldDeltas <= 0 {
		return fmt.Errorf("cluster config: %w: repair concurrency, inbox size and max held deltas must be positive", ErrInvalid)
	}
	switch c.Profile {
	case "lan", "wan", "local":
	default:
		return fmt.Errorf("cluster config: %w: profile %q (lan, wan or local)", ErrInvalid, c.Profile)
	}
	return nil
}

// memberlistConfig builds memberlist's config from c.
func (c *Config) memberlistConfig() (*memberlist.Config, error) {
	var mc *memberlist.Config
	switch c.Profile {
	case "wan":
		mc = memberlist.DefaultWANConfig()
	case "local":
		mc = memberlist.DefaultLocalConfig()
	default:
		mc = memberlist.DefaultLANConfig()
	}
	mc.Name = c.Meta.NodeID
	mc.BindAddr, mc.BindPort = c.BindAddr, c.BindPort
	mc.AdvertiseAddr, mc.AdvertisePort = c.AdvertiseAddr, c.AdvertisePort
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = c.BindPort // memberlist replaces both when BindPort is 0
	}
	mc.Label = c.Label
	// A pod that restarts with a new IP keeps its name; let it reclaim the name from the dead
	// member after a while instead of being refused until the dead entry is reaped.
	mc.DeadNodeReclaimTime = 30 * time.Second
	if len(c.Keys) > 0 {
		kr, err := memberlist.NewKeyring(c.Keys, c.Keys[0])
		if err != nil {
			return nil, fmt.Errorf("gossip keyring: %w", err)
		}
		mc.Keyring = kr
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	mc.Logger = newMemberlistLogger(c.Logger, nil)
	if c.tune != nil {
		c.tune(mc)
	}
	return mc, nil
}

// ReadKeyFile reads a gossip key file: one or more base64 keys (16, 24 or 32 bytes decoded),
// one per line, the first being the primary; blank lines and lines starting with # are skipped.
func ReadKeyFile(path string) ([][]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read gossip key file: %w", err)
	}
	var keys [][]byte
	for i, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("gossip key file %s line %d: %w", path, i+1, err)
		}
		if err := memberlist.ValidateKey(k); err != nil {
			return nil, fmt.Errorf("gossip key file %s line %d: %w", path, i+1, err)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("gossip key file %s: %w: no key", path, ErrInvalid)
	}
	return keys, nil
}
