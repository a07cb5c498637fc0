package cluster

import (
	"reflect"
	"testing"
)

// The fuzz targets check, for every decoder that reads from the network, that decoding never
// panics and that whatever is accepted re-encodes to an input the decoder accepts again with
// the same result. Their seeds run in the normal suite.

func FuzzDecodeDelta(f *testing.F) {
	d := Delta{NodeID: "n", Epoch: 1, FromSeq: 2, ToSeq: 4, Events: []Event{{5, true}, {6, false}}}
	b, _ := d.AppendBinary(nil)
	f.Add(b)
	f.Add([]byte{msgDelta, deltaVersion})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Delta
		if d.UnmarshalBinary(b) != nil {
			return
		}
		out, err := d.AppendBinary(nil)
		if err != nil {
			t.Fatalf("accepted delta does not re-encode: %v", err)
		}
		// Bytes may differ (unused bitmap bits, non-minimal varints); the meaning may not.
		var d2 Delta
		if err := d2.UnmarshalBinary(out); err != nil || !reflect.DeepEqual(d2, d) {
			t.Fatalf("re-encoded delta differs: %v", err)
		}
	})
}

func FuzzDecodeMeta(f *testing.F) {
	b, _ := sampleMeta().MarshalBinary()
	f.Add(b)
	cold := sampleMeta()
	cold.Cold = true
	b, _ = cold.MarshalBinary()
	f.Add(b)
	f.Add([]byte{metaVersion, byte(RoleRouter), 0})
	// The serving extension: whole, cut short, absent (an older node) and with a later
	// release's values and bytes after it.
	b, _ = servingMeta().MarshalBinary()
	f.Add(b)
	f.Add(b[:len(b)-1])
	f.Add(b[:len(b)-metaExtServingBytes])
	f.Add(append(append([]byte(nil), b[:len(b)-metaExtServingBytes]...), 9, 9, 0xff, 0xff, 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Meta
		if m.UnmarshalBinary(b) != nil {
			return
		}
		out, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("accepted meta does not re-encode: %v", err)
		}
		var m2 Meta
		if err := m2.UnmarshalBinary(out); err != nil || m2 != m {
			t.Fatalf("meta round trip: %v", err)
		}
	})
}

func FuzzDecodeState(f *testing.F) {
	s := State{NodeID: "n", Epoch: 1, HeadSeq: 2, Checksum: 3, Load: Load{Running: 1, At: 9}}
	b, _ := s.AppendBinary(nil)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var s State
		if s.UnmarshalBinary(b) != nil {
			return
		}
		out, err := s.AppendBinary(nil)
		if err != nil {
			t.Fatalf("accepted state does not re-encode: %v", err)
		}
		var s2 State
		if err := s2.UnmarshalBinary(out); err != nil || s2 != s {
			t.Fatalf("state round trip: %v", err)
		}
	})
}

func FuzzDecodeVector(f *testing.F) {
	v := Vector{Role: RoleNode, From: "n", Entries: []VersionEntry{{"n", 1, 2, 3}}}
	b, _ := v.AppendBinary(nil)
	f.Add(b)
	f.Add([]byte{msgPush, pushVersion, byte(RoleRouter), 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var v Vector
		if v.UnmarshalBinary(b) != nil {
			return
		}
		out, err := v.AppendBinary(nil)
		if err != nil {
			t.Fatalf("accepted vector does not re-encode: %v", err)
		}
		var v2 Vector
		if err := v2.UnmarshalBinary(out); err != nil || !reflect.DeepEqual(v2, v) {
			t.Fatalf("vector round trip: %v", err)
		}
	})
}

// FuzzMirrorHandle feeds arbitrary packets to a router's mirror: whatever decodes must be
// handled without panicking, the mirror and the index must agree on the node's sequence, and a
// repair must restore the node's truth whatever was applied before. (A well-formed packet is
// trusted: only members holding the gossip key can send one.)
func FuzzMirrorHandle(f *testing.F) {
	d := Delta{NodeID: "n1", Epoch: 11, FromSeq: 0, ToSeq: 2, Events: []Event{{5, true}, {5, false}}}
	b, _ := d.AppendBinary(nil)
	f.Add(b)
	s := State{NodeID: "n1", Epoch: 11, HeadSeq: 9}
	b, _ = s.AppendBinary(nil)
	f.Add(b)
	v := Vector{Role: RoleNode, From: "n1", Entries: []VersionEntry{{"n1", 11, 3, 4}}}
	b, _ = v.AppendBinary(nil)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		h := newMirrorHarness(t)
		h.mi.handle(b)
		h.mi.tick()
		p := h.mi.peers["n1"]
		if _, seq, _, ok := h.idx.NodeState("n1"); !ok || seq != p.seq {
			t.Fatalf("index at seq %d (ok=%v), mirror at %d", seq, ok, p.seq)
		}
		p.repairing, p.needRepair = false, true
		h.repair()
		h.check()
	})
}
