package cluster

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

func TestShareDecisionRoundTrip(t *testing.T) {
	d := ShareDecision{RouterID: "router-1", NodeID: "node-7", Offset: 12, Hashes: []uint64{1, 2, 1 << 63}}
	b, err := d.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != routing.ShareDecisionBytes(d.RouterID, d.NodeID, d.Offset, len(d.Hashes)) || !IsShareDecision(b) || IsShareLoad(b) {
		t.Fatalf("%d bytes, routing says %d", len(b), routing.ShareDecisionBytes(d.RouterID, d.NodeID, d.Offset, len(d.Hashes)))
	}
	var got ShareDecision
	if err := got.UnmarshalBinary(b); err != nil || !reflect.DeepEqual(got, d) {
		t.Fatalf("%+v %v", got, err)
	}
	for i := range b { // every truncation is an error, never a panic
		if err := got.UnmarshalBinary(b[:i]); err == nil {
			t.Fatalf("accepted %d of %d bytes", i, len(b))
		}
	}
	if err := got.UnmarshalBinary(append(b, 0)); err == nil {
		t.Fatal("accepted a trailing byte")
	}
}

// The packing rule keeps every chunk of a long chain within one packet, with the longest ids.
func TestShareChunksFitPackets(t *testing.T) {
	long := strings.Repeat("r", MaxNodeIDBytes)
	hashes := make([]uint64, 5000)
	for _, ids := range [][2]string{{"router-0", "node-1"}, {long, long}} {
		chunks := routing.AppendShareChunks(nil, ids[0], ids[1], 3, len(hashes))
		if len(chunks) != routing.MaxShareChunks || chunks[0].From != 3 {
			t.Fatalf("%d chunks %v", len(chunks), chunks[:1])
		}
		for _, c := range chunks {
			d := ShareDecision{RouterID: ids[0], NodeID: ids[1], Offset: c.From, Hashes: hashes[c.From:c.To]}
			b, err := d.AppendBinary(nil)
			if err != nil || len(b) > MaxPacketBytes {
				t.Fatalf("chunk %v: %d bytes, %v", c, len(b), err)
			}
		}
	}
	d := ShareDecision{RouterID: "r", NodeID: "n", Hashes: hashes[:MaxShareHashes+1]}
	if _, err := d.AppendBinary(nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized decision: %v", err)
	}
}

func TestShareLoadRoundTripAndParts(t *testing.T) {
	var loads []routing.NodeInFlight
	for i := range 300 {
		loads = append(loads, routing.NodeInFlight{Node: "node-" + strings.Repeat("x", i%40) + string(rune('a'+i%26)) + string(rune('0'+i%10)) + strings.Repeat("y", i/26),
			InFlight: routing.InFlight{Requests: i, Tokens: 1000 * i, PrefillTokens: 7 * i}})
	}
	parts := routing.AppendLoadParts(nil, "router-2", loads)
	if len(parts) < 2 || parts[len(parts)-1] != len(loads) {
		t.Fatalf("parts %v of %d", parts, len(loads))
	}
	start := 0
	var back []routing.NodeInFlight
	for p, end := range parts {
		l := ShareLoad{RouterID: "router-2", AtUnix: 42, Part: p, Parts: len(parts), Loads: loads[start:end]}
		b, err := l.AppendBinary(nil)
		if err != nil || len(b) > MaxPacketBytes || len(b) != routing.ShareLoadBytes(l.RouterID, l.Loads) || !IsShareLoad(b) {
			t.Fatalf("part %d: %d bytes (routing says %d), %v", p, len(b), routing.ShareLoadBytes(l.RouterID, l.Loads), err)
		}
		var got ShareLoad
		if err := got.UnmarshalBinary(b); err != nil || got.Part != p || got.Parts != len(parts) || got.AtUnix != 42 {
			t.Fatalf("part %d: %+v %v", p, got, err)
		}
		back = append(back, got.Loads...)
		for i := range b {
			if err := got.UnmarshalBinary(b[:i]); err == nil {
				t.Fatalf("accepted %d of %d bytes", i, len(b))
			}
		}
		start = end
	}
	if !reflect.DeepEqual(back, loads) {
		t.Fatal("loads differ after the round trip")
	}
	bad := ShareLoad{RouterID: "r", Part: 2, Parts: 2}
	if _, err := bad.AppendBinary(nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("part out of range: %v", err)
	}
}

// First-token observations round-trip at microsecond precision, split into packets that fit,
// and the sizes routing computes for the simulator are the encoder's.
func TestShareTTFTRoundTripAndParts(t *testing.T) {
	var obs []routing.TTFTObservation
	for i := range 300 {
		obs = append(obs, routing.TTFTObservation{Node: "node-" + strings.Repeat("x", i%30) + string(rune('a'+i%26)),
			Work: time.Duration(i) * 1234 * time.Microsecond, Seqs: i % 70, TTFT: time.Duration(i*i) * time.Microsecond})
	}
	parts := routing.AppendTTFTParts(nil, "router-2", obs)
	if len(parts) < 2 || parts[len(parts)-1] != len(obs) {
		t.Fatalf("parts %v of %d", parts, len(obs))
	}
	start := 0
	var back []routing.TTFTObservation
	for p, end := range parts {
		m := ShareTTFT{RouterID: "router-2", Obs: obs[start:end]}
		b, err := m.AppendBinary(nil)
		if err != nil || len(b) > MaxPacketBytes || len(b) != routing.ShareTTFTBytes(m.RouterID, m.Obs) || !IsShareTTFT(b) {
			t.Fatalf("part %d: %d bytes (routing says %d), %v", p, len(b), routing.ShareTTFTBytes(m.RouterID, m.Obs), err)
		}
		var got ShareTTFT
		if err := got.UnmarshalBinary(b); err != nil || got.RouterID != "router-2" {
			t.Fatalf("part %d: %+v %v", p, got, err)
		}
		back = append(back, got.Obs...)
		for i := range b {
			if err := got.UnmarshalBinary(b[:i]); err == nil {
				t.Fatalf("accepted %d of %d bytes", i, len(b))
			}
		}
		start = end
	}
	if !reflect.DeepEqual(back, obs) {
		t.Fatal("observations differ after the round trip")
	}
	if parts := routing.AppendTTFTParts(nil, "r", nil); len(parts) != 0 {
		t.Fatalf("no observations gave parts %v", parts)
	}
	bad := ShareTTFT{RouterID: "r", Obs: []routing.TTFTObservation{{Node: "n", TTFT: -time.Second}}}
	if _, err := bad.AppendBinary(nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative ttft: %v", err)
	}
	// Hand-built bytes: kind 3, router "r", one observation of node "n": 1500 µs of work, 2
	// sequences, 300 µs (uvarint 1500 = 0xdc 0x0b, 300 = 0xac 0x02).
	var got ShareTTFT
	raw := []byte{msgShare, shareVersion, 3, 1, 'r', 1, 1, 'n', 0xdc, 0x0b, 2, 0xac, 0x02}
	if err := got.UnmarshalBinary(raw); err != nil || len(got.Obs) != 1 ||
		got.Obs[0] != (routing.TTFTObservation{Node: "n", Work: 1500 * time.Microsecond, Seqs: 2, TTFT: 300 * time.Microsecond}) {
		t.Fatalf("hand-built packet: %+v %v", got, err)
	}
}

// FuzzDecodeShare: whatever a share decoder accepts re-encodes, and decodes again to the same.
func FuzzDecodeShare(f *testing.F) {
	d := ShareDecision{RouterID: "router-1", NodeID: "node-7", Offset: 1, Hashes: []uint64{9, 8}}
	b, _ := d.AppendBinary(nil)
	f.Add(b)
	l := ShareLoad{RouterID: "router-1", AtUnix: 5, Parts: 1, Loads: []routing.NodeInFlight{{Node: "n", InFlight: routing.InFlight{Requests: 1, Tokens: 2, PrefillTokens: 3}}}}
	b, _ = l.AppendBinary(nil)
	f.Add(b)
	f.Add([]byte{msgShare, shareVersion, shareLoad, 1, 'r', 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0})
	tt := ShareTTFT{RouterID: "router-1", Obs: []routing.TTFTObservation{{Node: "n", Work: time.Millisecond, Seqs: 3, TTFT: time.Second}}}
	b, _ = tt.AppendBinary(nil)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var d ShareDecision
		if d.UnmarshalBinary(b) == nil {
			out, err := d.AppendBinary(nil)
			var again ShareDecision
			if err != nil || again.UnmarshalBinary(out) != nil || !reflect.DeepEqual(again, d) {
				t.Fatalf("decision %+v does not round-trip: %v", d, err)
			}
		}
		var l ShareLoad
		if l.UnmarshalBinary(b) == nil {
			if _, err := l.AppendBinary(nil); err != nil {
				t.Fatalf("accepted load does not re-encode: %v", err)
			}
		}
		var tt ShareTTFT
		if tt.UnmarshalBinary(b) == nil {
			out, err := tt.AppendBinary(nil)
			var again ShareTTFT
			if err != nil || again.UnmarshalBinary(out) != nil || !reflect.DeepEqual(again, tt) {
				t.Fatalf("ttft %+v does not round-trip: %v", tt, err)
			}
		}
	})
}
