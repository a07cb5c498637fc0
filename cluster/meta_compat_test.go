package cluster

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"testing"
)

// Rolling upgrades mix releases in one gossip cluster: the serving extension (role, KV connector,
// bootstrap port) must not cost an older router a newer node, nor a newer router an older node.

// oldMetaHex are sampleMeta() and a router's metadata as the release before the serving
// extension encoded them (its MarshalBinary, captured once at that commit): version 1, the fixed
// fields, five strings, nothing after the model.
const (
	oldMetaHex       = "010101fecaefbeadde000010c0c407066e6f64652d330d31302e302e302e333a3730303014687474703a2f2f31302e302e302e333a383030300d31302e302e302e333a373330300a6c6c616d612d332d3862"
	oldRouterMetaHex = "01020000000000000000000000017200000000"
)

// decodeMetaBeforeServing is a frozen copy of UnmarshalBinary as it was before the serving
// extension: an older router's decoder. It refuses other versions and ignores trailing bytes.
// Do not update it with Meta: it stands for binaries already deployed.
func decodeMetaBeforeServing(b []byte) (Meta, error) {
	if len(b) > MaxMetaBytes {
		return Meta{}, fmt.Errorf("decode meta: %w: %d bytes", ErrTooLarge, len(b))
	}
	r := reader{b: b}
	if v := r.byte(); v != 1 {
		if r.err != nil {
			return Meta{}, fmt.Errorf("decode meta: %w", r.err)
		}
		return Meta{}, fmt.Errorf("decode meta: %w: version %d", ErrVersion, v)
	}
	var out Meta
	out.Role = Role(r.byte())
	flags := r.byte()
	out.Draining = flags&1 != 0
	out.Cold = flags&2 != 0
	out.Epoch = r.u64()
	bs := r.uvarint()
	if bs > math.MaxUint32 {
		return Meta{}, fmt.Errorf("decode meta: %w: block size %d", ErrInvalid, bs)
	}
	out.BlockSize = uint32(bs)
	out.KVCapacity = r.uvarint()
	out.NodeID = r.str(255)
	out.GRPCAddr = r.str(255)
	out.EngineURL = r.str(255)
	out.RaftAddr = r.str(255)
	out.Model = r.str(255)
	if r.err != nil {
		return Meta{}, fmt.Errorf("decode meta: %w", r.err)
	}
	if out.Role != RoleNode && out.Role != RoleRouter {
		return Meta{}, fmt.Errorf("decode meta: %w: role %d", ErrInvalid, out.Role)
	}
	if out.NodeID == "" {
		return Meta{}, fmt.Errorf("decode meta: %w: empty node id", ErrInvalid)
	}
	return out, nil
}

func servingMeta() Meta {
	m := sampleMeta()
	m.Serving, m.KVConnector, m.BootstrapPort = ServePrefill, KVConnectorSGLang, 8998
	return m
}

func peerMeta() Meta {
	m := sampleMeta()
	m.Serving, m.KVConnector, m.KVPeerAddr = ServeDecode, KVConnectorNIXL, "10.0.0.3:5600"
	return m
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A new router reads an old node: role both, no connector, every other field as written.
func TestMetaNewDecoderReadsOldBytes(t *testing.T) {
	for _, c := range []struct {
		hex  string
		want Meta
	}{{oldMetaHex, sampleMeta()}, {oldRouterMetaHex, Meta{Role: RoleRouter, NodeID: "r"}}} {
		var got Meta
		if err := got.UnmarshalBinary(mustHex(t, c.hex)); err != nil {
			t.Fatal(err)
		}
		if got != c.want || got.Serving != ServeBoth || got.KVConnector != KVConnectorNone || got.BootstrapPort != 0 {
			t.Fatalf("old bytes decoded as %+v, want %+v", got, c.want)
		}
	}
}

// An old router reads a new node: the same version, the extension ignored as trailing bytes,
// every field it knows intact.
func TestMetaOldDecoderReadsNewBytes(t *testing.T) {
	for _, m := range []Meta{servingMeta(), sampleMeta(), peerMeta(), {Role: RoleRouter, NodeID: "r"},
		{Role: RoleNode, NodeID: "d", Serving: ServeDecode, KVConnector: KVConnectorNIXL}} {
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeMetaBeforeServing(b)
		if err != nil {
			t.Fatalf("the old decoder refuses %+v: %v", m, err)
		}
		want := m
		want.Serving, want.KVConnector, want.BootstrapPort, want.KVPeerAddr = 0, 0, 0, ""
		if got != want {
			t.Fatalf("the old decoder read %+v, want %+v", got, want)
		}
	}
	// The frozen decoder is the old one: it reads the old golden bytes as the new one does.
	if got, err := decodeMetaBeforeServing(mustHex(t, oldMetaHex)); err != nil || got != sampleMeta() {
		t.Fatalf("frozen decoder on old bytes: %+v, %v", got, err)
	}
}

// The new encoding, byte for byte: the old bytes followed by role, connector and the port LE.
func TestMetaGoldenServing(t *testing.T) {
	for _, c := range []struct {
		m   Meta
		hex string
	}{
		{servingMeta(), oldMetaHex + "0102" + "2623" + "00"}, // prefill, sglang, 8998 = 0x2326, no KV peer
		{sampleMeta(), oldMetaHex + "0000" + "0000" + "00"},
		{Meta{Role: RoleRouter, NodeID: "r"}, oldRouterMetaHex + "00000000" + "00"},
		{Meta{Role: RoleNode, NodeID: "r", Serving: ServeDecode, KVConnector: KVConnectorNIXL}, "01010000000000000000000000017200000000" + "0201" + "0000" + "00"},
		// The KV peer extension: "10.0.0.3:5600" (13 bytes, 0x0d) after the serving extension.
		{peerMeta(), oldMetaHex + "0201" + "0000" + "0d" + "31302e302e302e333a35363030"},
	} {
		b, err := c.m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(b); got != c.hex {
			t.Fatalf("%+v encodes as\n%s, want\n%s", c.m, got, c.hex)
		}
		var back Meta
		if err := back.UnmarshalBinary(b); err != nil || back != c.m {
			t.Fatalf("%+v: decoded %+v, %v", c.m, back, err)
		}
	}
}

// A partial extension is damage, not an older encoder; bytes after the extension are a later
// release's; a role or connector this release does not know is carried, not refused.
func TestMetaServingExtension(t *testing.T) {
	b, err := servingMeta().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	base := len(b) - metaExtServingBytes - 1 // the serving extension, then an empty KV peer address
	var got Meta
	for n := 1; n < metaExtServingBytes; n++ {
		if err := got.UnmarshalBinary(b[:base+n]); !errors.Is(err, ErrTruncated) {
			t.Fatalf("extension cut to %d bytes: %v", n, err)
		}
	}
	if err := got.UnmarshalBinary(append(b[:len(b):len(b)], 9, 9, 9)); err != nil || got != servingMeta() {
		t.Fatalf("bytes after the extension: %+v, %v", got, err)
	}
	later := append([]byte(nil), b...)
	later[base], later[base+1] = 7, 9
	if err := got.UnmarshalBinary(later); err != nil || got.Serving.String() != "role(7)" || got.KVConnector.String() != "connector(9)" {
		t.Fatalf("a later release's role and connector: %+v, %v", got, err)
	}
	if out, err := got.MarshalBinary(); err != nil || string(out) != string(later) {
		t.Fatalf("a later release's values do not re-encode as they came: %v", err)
	}
}

func TestParseServingRoleAndConnector(t *testing.T) {
	for s, want := range map[string]ServingRole{"both": ServeBoth, "prefill": ServePrefill, "decode": ServeDecode} {
		if r, err := ParseServingRole(s); err != nil || r != want || r.String() != s {
			t.Errorf("ParseServingRole(%q) = %v, %v", s, r, err)
		}
	}
	for _, s := range []string{"", "Prefill", "role(3)", "encode"} {
		if _, err := ParseServingRole(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseServingRole(%q) accepted", s)
		}
	}
	for s, want := range map[string]KVConnector{"": KVConnectorNone, "none": KVConnectorNone, "nixl": KVConnectorNIXL, "sglang": KVConnectorSGLang} {
		if c, err := ParseKVConnector(s); err != nil || c != want {
			t.Errorf("ParseKVConnector(%q) = %v, %v", s, c, err)
		}
	}
	for _, s := range []string{"NIXL", "mooncake", "lmcache"} {
		if _, err := ParseKVConnector(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseKVConnector(%q) accepted", s)
		}
	}
}

// A KV peer extension cut short is damage; a release before it (the serving extension only)
// decodes with no address.
func TestMetaKVPeerExtension(t *testing.T) {
	b, err := peerMeta().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got Meta
	for cut := 1; cut < len(peerMeta().KVPeerAddr)+1; cut++ {
		if err := got.UnmarshalBinary(b[:len(b)-cut]); !errors.Is(err, ErrTruncated) {
			t.Fatalf("KV peer extension cut by %d bytes: %v", cut, err)
		}
	}
	before := b[:len(b)-1-len(peerMeta().KVPeerAddr)]
	want := peerMeta()
	want.KVPeerAddr = ""
	if err := got.UnmarshalBinary(before); err != nil || got != want {
		t.Fatalf("metadata of a release before the extension: %+v, %v", got, err)
	}
}
