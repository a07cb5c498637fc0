package cluster

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func sampleMeta() Meta {
	return Meta{Role: RoleNode, NodeID: "node-3", Epoch: 0xdeadbeefcafe, GRPCAddr: "10.0.0.3:7000",
		EngineURL: "http://10.0.0.3:8000", RaftAddr: "10.0.0.3:7300", Model: "llama-3-8b",
		BlockSize: 16, KVCapacity: 123456, Draining: true}
}

func TestMetaRoundTrip(t *testing.T) {
	for _, m := range []Meta{sampleMeta(), servingMeta(), {Role: RoleRouter, NodeID: "r"}} {
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != metaVersion {
			t.Fatalf("version byte %d", b[0])
		}
		var got Meta
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if got != m {
			t.Fatalf("got %+v want %+v", got, m)
		}
		// Trailing bytes are a later revision's additive fields.
		if err := got.UnmarshalBinary(append(b, 1, 2, 3)); err != nil || got != m {
			t.Fatalf("trailing bytes: %v %+v", err, got)
		}
	}
}

// The flags byte (offset 2): Cold and Draining round-trip independently, a metadata written
// before Cold existed decodes as not cold, and bits a later release may add are ignored.
func TestMetaFlags(t *testing.T) {
	for _, c := range []struct{ draining, cold bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		m := sampleMeta()
		m.Draining, m.Cold = c.draining, c.cold
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var got Meta
		if err := got.UnmarshalBinary(b); err != nil || got != m {
			t.Fatalf("%+v: got %+v, %v", c, got, err)
		}
		// An old encoder never set bit 1: that is "not cold".
		old := append([]byte(nil), b...)
		old[2] &^= metaFlagCold
		if err := got.UnmarshalBinary(old); err != nil || got.Cold || got.Draining != c.draining {
			t.Fatalf("%+v without the cold bit: got %+v, %v", c, got, err)
		}
		// Unknown bits from a later release change nothing.
		later := append([]byte(nil), b...)
		later[2] |= 0xfc
		if err := got.UnmarshalBinary(later); err != nil || got != m {
			t.Fatalf("%+v with unknown flag bits: got %+v, %v", c, got, err)
		}
	}
}

func TestMetaLimits(t *testing.T) {
	m := sampleMeta()
	long := strings.Repeat("x", maxMetaString)
	m.GRPCAddr, m.EngineURL, m.RaftAddr = long, long, long
	if _, err := m.MarshalBinary(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over %d bytes: %v", MaxMetaBytes, err)
	}
	m = sampleMeta()
	m.Model = long + "x"
	if _, err := m.MarshalBinary(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("long field: %v", err)
	}
	if _, err := (Meta{Role: 9, NodeID: "a"}).MarshalBinary(); !errors.Is(err, ErrInvalid) {
		t.Fatal("bad role accepted")
	}
	b, _ := sampleMeta().MarshalBinary()
	b[0] = 2
	var got Meta
	if err := got.UnmarshalBinary(b); !errors.Is(err, ErrVersion) {
		t.Fatalf("version 2: %v", err)
	}
	for i := 0; i < len(b)-1; i++ {
		if i == len(b)-1-metaExtServingBytes {
			continue // exactly an older release's metadata (TestMetaNewDecoderReadsOldBytes)
		}
		if err := got.UnmarshalBinary(b[:i]); err == nil {
			t.Fatalf("truncated at %d accepted", i)
		}
	}
}

func TestDeltaRoundTripAndCap(t *testing.T) {
	id := strings.Repeat("n", MaxNodeIDBytes)
	n := MaxDeltaEvents(len(id))
	if n < 120 {
		t.Fatalf("only %d events per packet with the longest id", n)
	}
	d := Delta{NodeID: id, Epoch: 7, FromSeq: 100, ToSeq: 100 + uint64(n), EmitUnix: -5}
	for i := 0; i < n; i++ {
		d.Events = append(d.Events, Event{Hash: uint64(i) * 0x9e3779b97f4a7c15, Added: i%3 != 0})
	}
	b, err := d.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxPacketBytes {
		t.Fatalf("%d bytes > %d", len(b), MaxPacketBytes)
	}
	var got Delta
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, d) {
		t.Fatal("round trip differs")
	}
	d.Events = append(d.Events, Event{Hash: 1})
	if _, err := d.AppendBinary(nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("one event over the cap: %v", err)
	}
	for _, short := range []int{0, 1, 2, 10, len(b) - 1} {
		if err := got.UnmarshalBinary(b[:short]); err == nil {
			t.Fatalf("truncated %d accepted", short)
		}
	}
	if err := got.UnmarshalBinary(append(b[:len(b):len(b)], 0)); err == nil {
		t.Fatal("trailing byte accepted")
	}
	for idLen := 1; idLen <= MaxNodeIDBytes; idLen++ {
		k := MaxDeltaEvents(idLen)
		if deltaFixedBytes+idLen+8*k+(k+7)/8 > MaxPacketBytes || deltaFixedBytes+idLen+8*(k+1)+(k+8)/8 <= MaxPacketBytes {
			t.Fatalf("MaxDeltaEvents(%d)=%d is not the largest that fits", idLen, k)
		}
	}
}

func TestStateAndVectorRoundTrip(t *testing.T) {
	s := State{NodeID: "node-1", Epoch: 1, HeadSeq: 2, Checksum: 3,
		Load: Load{Running: 4, Waiting: 5, FreeBlocks: 6, QueuedPrefillTokens: 7, At: 8}}
	b, err := s.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	var gs State
	if err := gs.UnmarshalBinary(b); err != nil || gs != s {
		t.Fatalf("state: %v %+v", err, gs)
	}
	v := Vector{Role: RoleRouter, From: "r1", Entries: []VersionEntry{{"a", 1, 2, 3}, {"b", 4, 5, 6}}}
	b, err = v.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	var gv Vector
	if err := gv.UnmarshalBinary(b); err != nil || !reflect.DeepEqual(gv, v) {
		t.Fatalf("vector: %v %+v", err, gv)
	}
	// A count that claims more entries than the bytes can hold is refused before allocating.
	bad := []byte{msgPush, pushVersion, byte(RoleNode), 1, 'x', 0xff, 0xff, 0x03}
	if err := gv.UnmarshalBinary(bad); err == nil {
		t.Fatal("huge count accepted")
	}
}

func TestSetChecksumIncremental(t *testing.T) {
	set := []uint64{1, 2, 3, 42}
	sum := applyChecksum(0, []Event{{1, true}, {2, true}, {9, true}, {3, true}, {9, false}, {42, true}})
	if sum != SetChecksum(set) {
		t.Fatal("incremental checksum differs from the set's")
	}
}
