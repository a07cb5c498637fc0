package kvevents

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Config says where an engine's KV events come from. Flags of `prefixmesh-node --engine
// vllm|sglang` map to it one to one (node/agentd).
type Config struct {
	// Endpoint is the engine's PUB socket, tcp://HOST:PORT. The subscriber dials it (vLLM binds
	// its default tcp://*:5557) unless Listen is set.
	Endpoint string
	// Listen makes the subscriber bind Endpoint and lets the engine dial in (an engine configured
	// with a concrete host rather than "*" connects; llm-d's centralized mode).
	Listen bool
	// Replay is the engine's ROUTER replay socket, tcp://HOST:PORT, or "" when the engine serves
	// none (vLLM's default: replay_endpoint None). Without it a gap forces a resync.
	Replay string
	// Topic is the subscription prefix: "" (vLLM's default topic) takes every message.
	Topic string
	// DPSize is the number of data-parallel ranks: rank r publishes on port + r (and replays on
	// replay port + r), vLLM's and SGLang's offset_endpoint_port. Default 1.
	DPSize int
	// ReplayTimeout bounds one replay exchange: 2 s, enough for a full 10,000-batch buffer over
	// loopback, short enough that a replay socket that never answers (an invalid request gets no
	// reply) does not stall the mirror for long.
	ReplayTimeout time.Duration
	// QueueLen is the per-rank queue between the socket reader and the applier: 4,096 batches,
	// about a second of a busy engine's steps; a full queue blocks the reader, and the engine's
	// PUB then drops at its high-water mark, which shows up as a gap and a replay.
	QueueLen int
	// RedialInterval is the pause between attempts to reach an engine that is not up yet: 500 ms.
	RedialInterval time.Duration
	// IdleProbe: after this long without a batch, the follower asks the replay socket (when there
	// is one) for anything after the last batch applied. A gap is otherwise seen only when a
	// later batch arrives, so losing the last batches before the engine goes quiet would leave
	// the mirror behind until the engine's next step. 2 s: a busy engine publishes every step,
	// so an idle probe costs a quiet engine one small request every 2 s.
	IdleProbe time.Duration
	// UnremovedTierTTL is how long the mirror believes a copy on a tier that has not sent a
	// removal on its rank (CacheMirror.SetUnremovedTTL): DefaultUnremovedTierTTL, 10 minutes (see
	// there for why). It applies per rank and tier, and only until that tier's first removal,
	// so it limits exactly the tiers that never remove (LMCache's), not the engine's own. 0
	// believes such copies until removed.
	UnremovedTierTTL time.Duration

	// OnRestart, when set, is called after a rank's mirror was dropped because the engine
	// restarted (its sequence went back, its replay buffer started over, or EngineRestarted):
	// the node agent moves to a new epoch, so routers drop the old cache at once. OnComplete,
	// when set, is called whenever a rank's completeness (Follower.Complete, the
	// prefixmesh_kvevents_mirror_complete gauge) or coldness changes: the node agent reads
	// Follower.Cold again and gossips it. An incomplete (partial) rank is a lower bound and still
	// credited; only a cold one keeps routers from crediting the node. Both run on the rank's applier goroutine (ranks
	// concurrently), the mirror already changed, and must not block.
	OnRestart  func(rank int)
	OnComplete func(rank int, complete bool)

	// Restore, when set, is the checkpoint the mirror was rebuilt from (ReadCheckpoint): each
	// rank with a position starts from it, cold, and checks what it missed first (see
	// Follower).
	Restore *Checkpoint
}

// DefaultConfig returns the defaults documented on Config, with vLLM's default endpoint as seen
// from a sidecar.
func DefaultConfig() Config {
	return Config{
		Endpoint:       "tcp://127.0.0.1:5557",
		DPSize:         1,
		ReplayTimeout:  2 * time.Second,
		QueueLen:       4096,
		RedialInterval: 500 * time.Millisecond,
		IdleProbe:      2 * time.Second,

		UnremovedTierTTL: DefaultUnremovedTierTTL,
	}
}

// MaxDPSize bounds --dp-size: one goroutine pair and socket per rank; 256 ranks is beyond any
// deployment and keeps a typo from opening thousands of sockets.
const MaxDPSize = 256

// ErrConfig is wrapped by every Validate error.
var ErrConfig = errors.New("invalid kv-events config")

// Validate reports the first invalid field, named by its flag.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if c.DPSize < 1 || c.DPSize > MaxDPSize {
		return bad("--dp-size %d: must be in [1, %d]", c.DPSize, MaxDPSize)
	}
	flag := "--kv-events"
	if c.Listen {
		flag = "--kv-events-listen"
	}
	if _, _, err := splitTCP(c.Endpoint); err != nil {
		return bad("%s %q: %v", flag, c.Endpoint, err)
	}
	if c.Replay != "" {
		rh, rp, err := splitTCP(c.Replay)
		if err != nil {
			return bad("--kv-events-replay %q: %v", c.Replay, err)
		}
		// Rank r publishes on port + r and replays on replay port + r: the two runs of ports
		// must not overlap (with 5557 and 5558 and two ranks, rank 1 would publish on rank 0's
		// replay port).
		h, p, _ := splitTCP(c.Endpoint)
		if h == rh && p != 0 && rp != 0 && p < rp+c.DPSize && rp < p+c.DPSize {
			return bad("%s %q and --kv-events-replay %q with --dp-size %d: ranks use ports %d-%d and %d-%d, which overlap; leave a gap of at least --dp-size (e.g. 5557 and 5657)",
				flag, c.Endpoint, c.Replay, c.DPSize, p, p+c.DPSize-1, rp, rp+c.DPSize-1)
		}
	}
	switch {
	case c.ReplayTimeout <= 0:
		return bad("replay timeout %v: must be positive", c.ReplayTimeout)
	case c.QueueLen <= 0:
		return bad("queue length %d: must be positive", c.QueueLen)
	case c.RedialInterval <= 0:
		return bad("redial interval %v: must be positive", c.RedialInterval)
	case c.IdleProbe <= 0:
		return bad("idle probe %v: must be positive", c.IdleProbe)
	case c.UnremovedTierTTL < 0:
		return bad("unremoved-tier TTL %v: must not be negative (0 keeps such copies until removed)", c.UnremovedTierTTL)
	}
	return nil
}

// splitTCP parses tcp://HOST:PORT.
func splitTCP(ep string) (host string, port int, err error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, errors.New("want tcp://HOST:PORT")
	}
	h, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, fmt.Errorf("want tcp://HOST:PORT: %v", err)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("port %q: want 0 to 65535", p)
	}
	return h, n, nil
}

// OffsetPort returns ep with its port moved up by rank (vLLM's offset_endpoint_port). Port 0
// stays 0 (tests bind ephemeral ports per rank themselves).
func OffsetPort(ep string, rank int) (string, error) {
	h, p, err := splitTCP(ep)
	if err != nil {
		return "", err
	}
	if p == 0 || rank == 0 {
		return ep, nil
	}
	if p+rank > 65535 {
		return "", fmt.Errorf("%q + rank %d: port out of range", ep, rank)
	}
	return "tcp://" + net.JoinHostPort(h, strconv.Itoa(p+rank)), nil
}
