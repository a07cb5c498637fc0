package pins

import (
	"errors"
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"

	"github.com/prefixmesh/prefixmesh/local"
)

// Size caps. Every command is checked against them before it is proposed (and again when a log
// entry or snapshot is decoded), so a replica never holds what another could not.
const (
	// MaxNameLen bounds an adapter name in bytes: names are shown in tables and metric labels;
	// 128 is more than any LoRA naming scheme we know of uses.
	MaxNameLen = 128
	// MaxBaseModelLen bounds a base model id; Hugging Face ids ("org/name") stay under 100 bytes.
	MaxBaseModelLen = 256
	// MaxRevisionLen bounds the weights label; a hex SHA-256 digest (64) plus a prefix fits.
	MaxRevisionLen = 128
	// MaxNodeIDLen bounds a node id: ids travel in memberlist metadata (at most cluster.MaxMetaBytes,
	// 512, in total), so a longer one could not belong to a real member.
	MaxNodeIDLen = 128
	// MaxPinNodes bounds the nodes of one pin: a pin names a placement subset; a fleet pins an
	// adapter to tens of nodes, and 256 keeps one pin below 33 KiB.
	MaxPinNodes = 256
	// MaxPrefixTokens bounds a pinned prefix: 32k tokens covers a long system prompt plus
	// few-shot examples and keeps a command (≤ 5 bytes per token) far below MaxCommandBytes.
	MaxPrefixTokens = 32 << 10
	// MaxCommandBytes bounds an encoded command: under gRPC's default 4 MiB message limit (commands
	// are forwarded over gRPC) and small enough that one Raft entry never stalls replication.
	MaxCommandBytes = 1 << 20
	// MaxAdapters bounds the adapters in the table: the whole table lives in every router's and
	// node's memory and in every Watch reset; 4096 adapters is above any multi-LoRA deployment.
	MaxAdapters = 4096
	// MaxPrefixPins bounds the prefix pins, for the same reason; pinned prefixes are a handful of
	// system prompts per adapter, not a cache.
	MaxPrefixPins = 4096
	// MaxTotalPrefixTokens bounds the tokens of all prefix pins together (4Mi tokens, 16 MiB as
	// uint32 and at most 20 MiB as varints), so every member can hold the table and a snapshot
	// stays small next to the KV cache it describes.
	MaxTotalPrefixTokens = 1 << 22
	// MaxServerAddrLen bounds a host:port gRPC address (a DNS name is at most 253 bytes).
	MaxServerAddrLen = 300
)

// Sentinel errors; the gRPC edge maps them to status codes.
var (
	// ErrInvalid: the command fails validation (bad ids, lengths over a cap, …).
	ErrInvalid = errors.New("pins: invalid argument")
	// ErrVersionMismatch: a compare-and-set saw another version; see *VersionError.
	ErrVersionMismatch = errors.New("pins: version mismatch")
	// ErrNotFound: the adapter or pin does not exist.
	ErrNotFound = errors.New("pins: not found")
	// ErrLimit: applying the command would exceed a table-wide cap.
	ErrLimit = errors.New("pins: table limit reached")
	// ErrUnavailable: no leader or no quorum before the deadline; retryable. A write that failed
	// with it may still be applied later.
	ErrUnavailable = errors.New("pins: unavailable (no leader or no quorum)")
	// ErrNotLeader: a PinsPeer call reached a member that is not the leader.
	ErrNotLeader = errors.New("pins: not the leader")
	// ErrCorrupt: a snapshot or log entry failed its checksum or decoding.
	ErrCorrupt = errors.New("pins: corrupt data")
	// ErrClosed: the store was shut down.
	ErrClosed = errors.New("pins: store closed")
)

// VersionError is a failed compare-and-set; errors.Is(err, ErrVersionMismatch) holds.
type VersionError struct {
	Expected, Current uint64
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("pins: version mismatch: expected %d, current %d", e.Expected, e.Current)
}

// Is makes errors.Is(err, ErrVersionMismatch) true.
func (e *VersionError) Is(target error) bool { return target == ErrVersionMismatch }

// Adapter describes one LoRA adapter. Version is the Raft index of its last change.
type Adapter struct {
	ID        uint64 `json:"id"`
	Name      string `json:"name"`
	BaseModel string `json:"base_model"`
	Revision  string `json:"revision"`
	Version   uint64 `json:"version"`
}

// AdapterPin restricts an adapter to Nodes (sorted, unique).
type AdapterPin struct {
	AdapterID uint64   `json:"adapter_id"`
	Nodes     []string `json:"nodes"`
	Version   uint64   `json:"version"`
}

// PrefixKey identifies a prefix pin: the adapter and PrefixHash of its tokens.
type PrefixKey struct {
	AdapterID uint64
	Hash      uint64
}

// PrefixPin asks Nodes to keep (AdapterID, Tokens) cached. Tokens are never mutated once stored.
type PrefixPin struct {
	AdapterID uint64   `json:"adapter_id"`
	Hash      uint64   `json:"prefix_hash,string"`
	Tokens    []uint32 `json:"tokens"`
	Nodes     []string `json:"nodes"`
	Version   uint64   `json:"version"`
}

// Key returns the pin's table key.
func (p PrefixPin) Key() PrefixKey { return PrefixKey{p.AdapterID, p.Hash} }

// PrefixHash is the canonical hash of a whole token prefix: the canonical block hash
// (docs/architecture.md, "The canonical block hash") with the entire prefix as one block,
// xxhash64(LE64(seed(adapter)) ‖ LE32(tok…)). It is a key, not proof of identity: the FSM
// compares the stored tokens too and refuses a colliding prefix.
func PrefixHash(adapterID uint64, tokens []uint32) uint64 {
	return local.ChainHash(local.AdapterSeed(adapterID), tokens)
}

// normalizeNodes returns the sorted, de-duplicated copy of nodes.
func normalizeNodes(nodes []string) []string {
	out := slices.Clone(nodes)
	slices.Sort(out)
	return slices.Compact(out)
}

// checkText validates a printable, valid UTF-8 string of at most max bytes.
func checkText(field, s string, max int, required bool) error {
	if required && s == "" {
		return fmt.Errorf("%w: %s is required", ErrInvalid, field)
	}
	if len(s) > max {
		return fmt.Errorf("%w: %s is %d bytes, over the limit of %d", ErrInvalid, field, len(s), max)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, field)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %s holds a non-printable character %q", ErrInvalid, field, r)
		}
	}
	return nil
}

// checkNodes validates a sorted, unique node set (1..MaxPinNodes ids).
func checkNodes(nodes []string) error {
	if len(nodes) == 0 {
		return fmt.Errorf("%w: nodes: at least one node is required", ErrInvalid)
	}
	if len(nodes) > MaxPinNodes {
		return fmt.Errorf("%w: nodes: %d nodes, over the limit of %d", ErrInvalid, len(nodes), MaxPinNodes)
	}
	for i, n := range nodes {
		if err := checkText("node id", n, MaxNodeIDLen, true); err != nil {
			return err
		}
		if i > 0 && nodes[i-1] >= n {
			return fmt.Errorf("%w: nodes must be sorted and unique", ErrInvalid)
		}
	}
	return nil
}

func checkAdapterID(id uint64) error {
	if id == 0 {
		return fmt.Errorf("%w: adapter id must be non-zero (0 is the base model)", ErrInvalid)
	}
	return nil
}

func checkTokens(tokens []uint32) error {
	if len(tokens) == 0 {
		return fmt.Errorf("%w: tokens: a prefix pin needs at least one token", ErrInvalid)
	}
	if len(tokens) > MaxPrefixTokens {
		return fmt.Errorf("%w: tokens: %d tokens, over the limit of %d", ErrInvalid, len(tokens), MaxPrefixTokens)
	}
	return nil
}

// validateAdapter checks an adapter's descriptive fields.
func validateAdapter(a Adapter) error {
	if err := checkAdapterID(a.ID); err != nil {
		return err
	}
	if err := checkText("name", a.Name, MaxNameLen, true); err != nil {
		return err
	}
	if err := checkText("base_model", a.BaseModel, MaxBaseModelLen, false); err != nil {
		return err
	}
	return checkText("revision", a.Revision, MaxRevisionLen, false)
}
