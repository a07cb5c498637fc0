package cluster

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Role says what a member does in the fleet.
type Role uint8

const (
	// RoleNode is a GPU node's cache agent: it owns a tree and publishes its summary.
	RoleNode Role = 1
	// RoleRouter mirrors every node's summary and routes requests.
	RoleRouter Role = 2
)

func (r Role) String() string {
	switch r {
	case RoleNode:
		return "node"
	case RoleRouter:
		return "router"
	default:
		return fmt.Sprintf("role(%d)", uint8(r))
	}
}

// ServingRole is the part of inference a node's engine serves. Under prefill/decode
// disaggregation a prefill engine computes prompts' KV and hands it to a decode engine through a
// KV connector, so a router must know which nodes can take which phase: it sends prefill legs
// only to prefill nodes, whole requests and decode legs to the others.
type ServingRole uint8

const (
	// ServeBoth is the zero value: a node whose metadata predates roles serves whole requests,
	// as every node did before.
	ServeBoth    ServingRole = 0
	ServePrefill ServingRole = 1
	ServeDecode  ServingRole = 2
)

func (r ServingRole) String() string {
	switch r {
	case ServeBoth:
		return "both"
	case ServePrefill:
		return "prefill"
	case ServeDecode:
		return "decode"
	default:
		// A later release's role: carried and shown as a number rather than refused, so that a
		// rolling upgrade that adds one keeps the node in every older router's view.
		return fmt.Sprintf("role(%d)", uint8(r))
	}
}

// ParseServingRole parses a role's name (ServingRole.String) as the node agent's --role takes it.
func ParseServingRole(s string) (ServingRole, error) {
	for _, r := range [...]ServingRole{ServeBoth, ServePrefill, ServeDecode} {
		if s == r.String() {
			return r, nil
		}
	}
	return 0, fmt.Errorf("%w: role %q: want prefill, decode or both", ErrInvalid, s)
}

// KVConnector names how a node's engine moves KV to or from other engines (prefill to decode).
type KVConnector uint8

const (
	// KVConnectorNone is the zero value: no connector configured (and every node whose metadata
	// predates connectors).
	KVConnectorNone KVConnector = 0
	// KVConnectorNIXL is NVIDIA's NIXL transfer library (vLLM's NixlConnector, SGLang's nixl
	// backend).
	KVConnectorNIXL KVConnector = 1
	// KVConnectorSGLang is SGLang's own disaggregation transfer, whose decode side first asks the
	// prefill engine's bootstrap server (Meta.BootstrapPort).
	KVConnectorSGLang KVConnector = 2
)

func (c KVConnector) String() string {
	switch c {
	case KVConnectorNone:
		return "none"
	case KVConnectorNIXL:
		return "nixl"
	case KVConnectorSGLang:
		return "sglang"
	default:
		return fmt.Sprintf("connector(%d)", uint8(c)) // a later release's, as for ServingRole
	}
}

// ParseKVConnector parses a connector's name as the node agent's --kv-connector takes it: nixl,
// sglang, or "" (or "none") for none.
func ParseKVConnector(s string) (KVConnector, error) {
	switch s {
	case "", "none":
		return KVConnectorNone, nil
	case "nixl":
		return KVConnectorNIXL, nil
	case "sglang":
		return KVConnectorSGLang, nil
	}
	return 0, fmt.Errorf("%w: KV connector %q: want nixl or sglang (empty: none)", ErrInvalid, s)
}

// metaVersion is the first byte of encoded metadata. Fields appended at the end by a later
// revision keep the version (decoders ignore trailing bytes, so a rolling upgrade can add
// fields); a change that reinterprets an existing field takes a new version.
const metaVersion = 1

// MaxMetaBytes is memberlist's limit on node metadata (memberlist.MetaMaxSize): metadata rides in
// every alive message, which must fit one UDP packet with the rest of the gossip.
const MaxMetaBytes = 512

// maxMetaString bounds each string field so that all five together stay under MaxMetaBytes
// with the fixed fields, and a hostile length prefix cannot ask for a large allocation.
const maxMetaString = 255

// Flag bits of Meta's flags byte. A decoder ignores bits it does not know, so a flag added by a
// later release is invisible to an older router during a rolling upgrade (it keeps routing as
// before) and needs no new version.
const (
	metaFlagDraining = 1 << 0
	metaFlagCold     = 1 << 1 // the node's mirror of its engine's cache may over-estimate it
)

// Meta is a member's metadata, carried by memberlist in its alive messages.
type Meta struct {
	Role       Role
	NodeID     string
	Epoch      uint64 // random at process start, new when a mirrored engine restarts (Agent.SetEpoch): a new epoch means an empty cache
	GRPCAddr   string // NodeCache (nodes) or Router (routers) gRPC address
	EngineURL  string // OpenAI-compatible engine base URL (nodes)
	RaftAddr   string // Raft address when the member is a pin-store voter
	Model      string
	BlockSize  uint32 // tokens per KV block
	KVCapacity uint64 // KV capacity in blocks
	Draining   bool
	// Cold: the node's view of its cache may hold blocks the engine no longer has (a mirror
	// reloaded from a checkpoint whose gap is not replayed yet), so its summary may over-estimate.
	// Routers still send it load but take no prefix affinity from it until it clears. A partial
	// mirror (late join, lost events beyond replay, rebuilt since) is a lower bound and not cold.
	Cold bool
	// Serving, KVConnector and BootstrapPort say which phase of inference the node's engine
	// serves and how it exchanges KV with others (prefill/decode disaggregation). They are the
	// metadata's first trailing extension (metaExtServingBytes), so that an older router, which
	// ignores trailing bytes, still decodes a newer node's metadata, and a node whose metadata
	// has no extension decodes as ServeBoth with no connector.
	Serving     ServingRole
	KVConnector KVConnector
	// BootstrapPort is the engine's SGLang bootstrap port, which a decode engine asks for the
	// prefill engine's KV (with KVConnectorSGLang; 0 otherwise).
	BootstrapPort uint16
	// KVPeerAddr is the host:port where other engines pull this engine's KV (vLLM's NIXL side
	// channel as llm-d's P2P connector reaches it; the simulated engine's side channel), "" when
	// it has none: what a router names as a peer pull's source. It is the metadata's second
	// trailing extension (a uvarint-length string after the serving extension).
	KVPeerAddr string
}

// metaExtServingBytes is the size of the serving extension after the model: role, connector,
// bootstrap port (uint16 LE). It is all or nothing: an encoder that writes it writes all four
// bytes, so a partial one is a damaged packet, not an older encoder.
const metaExtServingBytes = 4

// MarshalBinary encodes m: version, role, flags, epoch (8 bytes LE), block size and capacity
// (uvarints), then node id, gRPC address, engine URL, Raft address and model as uvarint-length
// strings, then the serving extension (metaExtServingBytes: serving role, KV connector, bootstrap
// port as uint16 LE) and the KV peer extension (KVPeerAddr as a uvarint-length string), always
// written so that a later extension can follow them. It fails when a
// field is out of range or the result exceeds MaxMetaBytes. Roles and connectors unknown to this
// release are encoded as they are: the node agent's flags refuse unknown names, and a router
// keeps a later release's values rather than refusing the node.
func (m Meta) MarshalBinary() ([]byte, error) {
	return m.appendBinary(make([]byte, 0, 128))
}

func (m Meta) appendBinary(b []byte) ([]byte, error) {
	if m.Role != RoleNode && m.Role != RoleRouter {
		return nil, fmt.Errorf("encode meta: %w: role %d", ErrInvalid, m.Role)
	}
	if m.NodeID == "" {
		return nil, fmt.Errorf("encode meta: %w: empty node id", ErrInvalid)
	}
	var flags byte
	if m.Draining {
		flags |= metaFlagDraining
	}
	if m.Cold {
		flags |= metaFlagCold
	}
	b = append(b, metaVersion, byte(m.Role), flags)
	b = binary.LittleEndian.AppendUint64(b, m.Epoch)
	b = binary.AppendUvarint(b, uint64(m.BlockSize))
	b = binary.AppendUvarint(b, m.KVCapacity)
	for _, s := range [...]string{m.NodeID, m.GRPCAddr, m.EngineURL, m.RaftAddr, m.Model} {
		if len(s) > maxMetaString {
			return nil, fmt.Errorf("encode meta: %w: field of %d bytes (max %d)", ErrInvalid, len(s), maxMetaString)
		}
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = append(b, byte(m.Serving), byte(m.KVConnector))
	b = binary.LittleEndian.AppendUint16(b, m.BootstrapPort)
	if len(m.KVPeerAddr) > maxMetaString {
		return nil, fmt.Errorf("encode meta: %w: KV peer address of %d bytes (max %d)", ErrInvalid, len(m.KVPeerAddr), maxMetaString)
	}
	b = binary.AppendUvarint(b, uint64(len(m.KVPeerAddr)))
	b = append(b, m.KVPeerAddr...)
	if len(b) > MaxMetaBytes {
		return nil, fmt.Errorf("encode meta: %w: %d bytes (max %d)", ErrTooLarge, len(b), MaxMetaBytes)
	}
	return b, nil
}

// UnmarshalBinary decodes metadata written by MarshalBinary or by an older release: metadata that
// ends after the model predates the serving extension and decodes as ServeBoth with no
// connector. Bytes after the known extensions are a later release's and are ignored (see
// metaVersion).
func (m *Meta) UnmarshalBinary(b []byte) error {
	if len(b) > MaxMetaBytes {
		return fmt.Errorf("decode meta: %w: %d bytes", ErrTooLarge, len(b))
	}
	r := reader{b: b}
	if v := r.byte(); v != metaVersion {
		if r.err != nil {
			return fmt.Errorf("decode meta: %w", r.err)
		}
		return fmt.Errorf("decode meta: %w: version %d", ErrVersion, v)
	}
	var out Meta
	out.Role = Role(r.byte())
	flags := r.byte()
	out.Draining = flags&metaFlagDraining != 0
	out.Cold = flags&metaFlagCold != 0 // other bits: a later release's flags, ignored
	out.Epoch = r.u64()
	bs := r.uvarint()
	if bs > math.MaxUint32 {
		return fmt.Errorf("decode meta: %w: block size %d", ErrInvalid, bs)
	}
	out.BlockSize = uint32(bs)
	out.KVCapacity = r.uvarint()
	out.NodeID = r.str(maxMetaString)
	out.GRPCAddr = r.str(maxMetaString)
	out.EngineURL = r.str(maxMetaString)
	out.RaftAddr = r.str(maxMetaString)
	out.Model = r.str(maxMetaString)
	if r.err == nil && len(r.b) > 0 {
		// The serving extension; absent (an older node) leaves the zero values.
		ext := r.bytes(metaExtServingBytes)
		if r.err == nil {
			out.Serving, out.KVConnector = ServingRole(ext[0]), KVConnector(ext[1])
			out.BootstrapPort = binary.LittleEndian.Uint16(ext[2:])
		}
		if r.err == nil && len(r.b) > 0 {
			// The KV peer extension; absent (a release before it) leaves "".
			out.KVPeerAddr = r.str(maxMetaString)
		}
	}
	if r.err != nil {
		return fmt.Errorf("decode meta: %w", r.err)
	}
	if out.Role != RoleNode && out.Role != RoleRouter {
		return fmt.Errorf("decode meta: %w: role %d", ErrInvalid, out.Role)
	}
	if out.NodeID == "" {
		return fmt.Errorf("decode meta: %w: empty node id", ErrInvalid)
	}
	*m = out
	return nil
}
