package kvevents

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"

	"github.com/vmihailenco/msgpack/v5"
)

// Layout is how an Encoder lays events out, as vLLM's msgspec structs do.
type Layout uint8

const (
	// LayoutArray: tagged positional arrays (array_like=True, vLLM before #42892, SGLang before
	// #37482), trailing default fields omitted.
	LayoutArray Layout = iota
	// LayoutMap: tagged maps keyed by "type" (vLLM #42892, observed in v0.26.0).
	LayoutMap
)

// HashFormat is how block hashes go on the wire.
type HashFormat uint8

const (
	// HashInt: an unsigned 64-bit integer in the shortest msgpack form
	// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default).
	HashInt HashFormat = iota
	// HashBytes: a 32-byte digest as msgpack bin whose last 8 bytes are the key (the variable
	// set to 0).
	HashBytes
)

// Encoder writes vLLM KV event batches: the simulated engine's publisher and the tests' reference
// producer. Not safe for concurrent use.
type Encoder struct {
	Layout Layout
	Hashes HashFormat
	// ParentZero writes a first block's missing parent as the integer 0 instead of nil, as some
	// non-vLLM publishers do.
	ParentZero bool
	buf        bytes.Buffer
	enc        *msgpack.Encoder
}

// NewEncoder returns an encoder for layout and hash format.
func NewEncoder(layout Layout, hashes HashFormat) *Encoder {
	e := &Encoder{Layout: layout, Hashes: hashes}
	e.enc = msgpack.NewEncoder(&e.buf)
	e.enc.UseCompactInts(true)
	return e
}

// Encode returns the payload of a batch, [ts, events, rank] in LayoutArray and {"ts", "events",
// "data_parallel_rank"} in LayoutMap (vLLM's EventBatch struct, msgspec's field order); the
// bytes are valid until the next call. Only the fields Event carries are written (lora_id and
// the spec fields as nil or absent). With ParentZero, "no parent" is written as 0 instead of nil.
func (e *Encoder) Encode(ts float64, events []Event, rank int) []byte {
	e.buf.Reset()
	enc := e.enc
	if e.Layout == LayoutMap {
		_ = enc.EncodeMapLen(3)
		_ = enc.EncodeString("ts")
		_ = enc.EncodeFloat64(ts)
		_ = enc.EncodeString("events")
	} else {
		_ = enc.EncodeArrayLen(3)
		_ = enc.EncodeFloat64(ts)
	}
	_ = enc.EncodeArrayLen(len(events))
	for i := range events {
		e.event(&events[i])
	}
	if e.Layout == LayoutMap {
		_ = enc.EncodeString("data_parallel_rank")
	}
	_ = enc.EncodeInt(int64(rank))
	return e.buf.Bytes()
}

func (e *Encoder) event(ev *Event) {
	enc := e.enc
	medium := func() { _ = enc.EncodeString(mediumOf(ev.Tier)) }
	loraName := func() {
		if ev.LoRAName == "" {
			_ = enc.EncodeNil()
		} else {
			_ = enc.EncodeString(ev.LoRAName)
		}
	}
	switch ev.Kind {
	case KindStored:
		if e.Layout == LayoutMap {
			_ = enc.EncodeMapLen(9)
			_ = enc.EncodeString("type")
			_ = enc.EncodeString("BlockStored")
			_ = enc.EncodeString("block_hashes")
			e.hashes(ev.Hashes)
			_ = enc.EncodeString("parent_block_hash")
			e.parent(ev)
			_ = enc.EncodeString("token_ids")
			e.tokens(ev.Tokens)
			_ = enc.EncodeString("block_size")
			_ = enc.EncodeInt(int64(ev.BlockSize))
			_ = enc.EncodeString("lora_id")
			_ = enc.EncodeNil()
			_ = enc.EncodeString("medium")
			medium()
			_ = enc.EncodeString("lora_name")
			loraName()
			_ = enc.EncodeString("group_idx")
			_ = enc.EncodeInt(int64(ev.Group))
			return
		}
		n := 8 // through lora_name; group_idx only when set (omit_defaults drops a trailing run)
		if ev.Group != 0 {
			n = 10
		}
		_ = enc.EncodeArrayLen(n)
		_ = enc.EncodeString("BlockStored")
		e.hashes(ev.Hashes)
		e.parent(ev)
		e.tokens(ev.Tokens)
		_ = enc.EncodeInt(int64(ev.BlockSize))
		_ = enc.EncodeNil() // lora_id (deprecated)
		medium()
		loraName()
		if n == 10 {
			_ = enc.EncodeNil() // extra_keys
			_ = enc.EncodeInt(int64(ev.Group))
		}
	case KindRemoved:
		if e.Layout == LayoutMap {
			_ = enc.EncodeMapLen(4)
			_ = enc.EncodeString("type")
			_ = enc.EncodeString("BlockRemoved")
			_ = enc.EncodeString("block_hashes")
			e.hashes(ev.Hashes)
			_ = enc.EncodeString("medium")
			medium()
			_ = enc.EncodeString("group_idx")
			_ = enc.EncodeInt(int64(ev.Group))
			return
		}
		n := 3
		if ev.Group != 0 {
			n = 4
		}
		_ = enc.EncodeArrayLen(n)
		_ = enc.EncodeString("BlockRemoved")
		e.hashes(ev.Hashes)
		medium()
		if n == 4 {
			_ = enc.EncodeInt(int64(ev.Group))
		}
	case KindCleared:
		if e.Layout == LayoutMap {
			_ = enc.EncodeMapLen(1)
			_ = enc.EncodeString("type")
		} else {
			_ = enc.EncodeArrayLen(1)
		}
		_ = enc.EncodeString("AllBlocksCleared")
	}
}

func (e *Encoder) parent(ev *Event) {
	if !ev.HasParent {
		if e.ParentZero {
			_ = e.enc.EncodeUint(0)
			return
		}
		_ = e.enc.EncodeNil()
		return
	}
	e.hash(ev.Parent)
}

func (e *Encoder) hashes(hs []uint64) {
	_ = e.enc.EncodeArrayLen(len(hs))
	for _, h := range hs {
		e.hash(h)
	}
}

func (e *Encoder) hash(h uint64) {
	if e.Hashes == HashInt {
		_ = e.enc.EncodeUint(h)
		return
	}
	d := DigestFor(h)
	_ = e.enc.EncodeBytes(d[:])
}

func (e *Encoder) tokens(ts []uint32) {
	_ = e.enc.EncodeArrayLen(len(ts))
	for _, t := range ts {
		_ = e.enc.EncodeUint(uint64(t))
	}
}

// DigestFor is a 32-byte digest whose last 8 bytes are key big-endian (what the decoder keys bytes
// hashes by), the rest derived from key so that digests differ in every byte.
func DigestFor(key uint64) [32]byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], key)
	d := sha256.Sum256(k[:])
	copy(d[24:], k[:])
	return d
}

// mediumOf is the medium string an engine sends for t, as vLLM spells it (vllm/v1/kv_offload/
// mediums.py, vllm/distributed/kv_events.py). A remote copy is sent as "STORAGE" here, without
// its REMOTE locality (the simulated engine has no remote tier), so it decodes as TierStorage.
func mediumOf(t Tier) string {
	switch t {
	case TierGPU:
		return "GPU"
	case TierCPU:
		return "CPU"
	case TierDisk:
		return "Disk"
	case TierStorage, TierRemote:
		return "STORAGE"
	}
	return t.String()
}
