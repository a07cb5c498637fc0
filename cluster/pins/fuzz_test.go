package pins

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
)

// seededFSM returns a table with some of everything, for fuzz seeds and targets.
func seededFSM(t testing.TB) *FSM {
	f := NewFSM()
	applyCmd(t, f, 1, putAdapter(1))
	applyCmd(t, f, 2, Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"a", "b"}})
	applyCmd(t, f, 3, Command{Op: OpPinPrefix, AdapterID: 1, Tokens: []uint32{1, 2, 3}, Nodes: []string{"a"}})
	applyCmd(t, f, 4, Command{Op: OpSetServer, ServerID: "r0", Addr: "127.0.0.1:1"})
	return f
}

// FuzzDecodeCommand: whatever DecodeCommand accepts re-encodes identically and applies without
// panicking, on an empty and on a populated table.
func FuzzDecodeCommand(f *testing.F) {
	for _, c := range []Command{
		putAdapter(1),
		{Op: OpDeleteAdapter, AdapterID: 1, Cond: IfVersion(3)},
		{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"a", "b"}},
		{Op: OpUnpinAdapter, AdapterID: 1},
		{Op: OpPinPrefix, AdapterID: 1, Tokens: []uint32{1, 2, 1 << 31}, Nodes: []string{"x"}, Cond: IfVersion(0)},
		{Op: OpUnpinPrefix, AdapterID: 1, PrefixHash: 99},
		{Op: OpUnpinPrefix, AdapterID: 1, Tokens: []uint32{1, 2, 3}},
		{Op: OpSetServer, ServerID: "r1", Addr: "10.0.0.1:9000"},
	} {
		c.Normalize()
		f.Add(c.Encode())
	}
	f.Add([]byte{})
	f.Add([]byte{1, 5, 0, 1, 255, 255, 255, 255, 15})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
		if err != nil {
			return
		}
		// The encoding may differ from b (overlong varints); it must decode to the same command.
		again, err := DecodeCommand(c.Encode())
		if err != nil || !bytes.Equal(again.Encode(), c.Encode()) {
			t.Fatalf("accepted command does not round-trip: %v", err)
		}
		for _, fsm := range []*FSM{NewFSM(), seededFSM(t)} {
			fsm.Apply(&raft.Log{Index: 10, Type: raft.LogCommand, Data: b})
			checkInvariants(t, fsm)
		}
	})
}

// FuzzRestore: whatever Restore accepts yields a consistent table whose snapshot round-trips.
// The fuzzer mutates the body and the target appends a valid checksum, so mutations reach the
// decoder instead of dying at the CRC check (damaged checksums are TestRestoreRefusesDamage's).
func FuzzRestore(f *testing.F) {
	for _, fsm := range []*FSM{seededFSM(f), NewFSM()} {
		b := snap(f, fsm)
		f.Add(b[:len(b)-4])
	}
	f.Add([]byte("PMPS\x01"))
	f.Fuzz(func(t *testing.T, body []byte) {
		b := binary.LittleEndian.AppendUint32(slices.Clone(body), crc32.Checksum(body, castagnoli))
		fsm := NewFSM()
		if err := fsm.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
			return
		}
		checkInvariants(t, fsm)
		// Re-encoding is a fixed point (b itself may use overlong varints or another order).
		b1 := snap(t, fsm)
		again := NewFSM()
		if err := again.Restore(io.NopCloser(bytes.NewReader(b1))); err != nil || !bytes.Equal(snap(t, again), b1) {
			t.Fatalf("accepted snapshot does not round-trip: %v", err)
		}
		fsm.Apply(&raft.Log{Index: fsm.AppliedIndex() + 1, Type: raft.LogCommand, Data: (&Command{Op: OpDeleteAdapter, AdapterID: 1}).Encode()})
		checkInvariants(t, fsm)
	})
}
