package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Caps on what one message may ask the decoder to hold. An engine step stores at most a few
// thousand blocks (a long prompt prefilled at once), so these are far above any real batch and
// bound the memory a corrupt or hostile message can claim.
const (
	// MaxPayloadBytes: a batch of 65,536 events of 16-token blocks is ~6 MiB; 16 MiB leaves room
	// for 64-token blocks and long extra keys.
	MaxPayloadBytes = 16 << 20
	// MaxEvents per batch: 65,536, one step storing a 1M-token prompt in 16-token blocks.
	MaxEvents = 1 << 16
	// MaxBlocksPerEvent: 65,536 hashes (a 1M-token prompt of 16-token blocks in one event).
	MaxBlocksPerEvent = 1 << 16
	// MaxTokensPerEvent: 1,048,576 tokens, node.MaxTokens, the longest prompt the agent accepts.
	MaxTokensPerEvent = 1 << 20
	// maxKeyBytes: map keys and tags longer than this are no field we know and are skipped.
	maxKeyBytes = 64
	// maxNameBytes: a LoRA name or medium string longer than this is malformed (vLLM's LoRA
	// names are paths' basenames; mediums are short enum names).
	maxNameBytes = 1024
)

// Errors of Decode. A message failing with one of these is dropped whole and counted; an event
// that is merely unknown or malformed is skipped inside a batch that still applies.
var (
	ErrFrames  = errors.New("kvevents: want 3 frames [topic, seq, payload]")
	ErrSeq     = errors.New("kvevents: sequence frame is not 8 bytes")
	ErrPayload = errors.New("kvevents: malformed payload")
	ErrTooBig  = errors.New("kvevents: payload over a cap")
)

// Decoder decodes KV-event messages of vLLM (array and map events, both batch shapes) and SGLang.
// It reuses its buffers: a Batch it returns is valid until the next call. Not safe for concurrent
// use; each source's applier owns one.
type Decoder struct {
	r     bytes.Reader
	dec   *msgpack.Decoder
	batch Batch
	key   [maxKeyBytes]byte
	names map[string]string // interned LoRA names, so a steady stream allocates none
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	d := &Decoder{names: make(map[string]string)}
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}

// DecodeSeq parses the 8-byte big-endian sequence frame.
func DecodeSeq(frame []byte) (uint64, error) {
	if len(frame) != 8 {
		return 0, fmt.Errorf("%w: %d bytes", ErrSeq, len(frame))
	}
	return binary.BigEndian.Uint64(frame), nil
}

// Decode decodes one payload (the third frame) with sequence number seq.
func (d *Decoder) Decode(seq uint64, payload []byte) (*Batch, error) {
	if len(payload) > MaxPayloadBytes {
		return nil, fmt.Errorf("%w: %d payload bytes (max %d)", ErrTooBig, len(payload), MaxPayloadBytes)
	}
	b := &d.batch
	events := b.Events[:0]
	*b = Batch{Seq: seq, Events: events}
	d.r.Reset(payload)
	d.dec.ResetReader(&d.r)
	if err := d.decodeBatch(b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPayload, err)
	}
	return b, nil
}

// decodeBatch reads [ts, events, rank?, …] or {ts, events, data_parallel_rank|attn_dp_rank}.
func (d *Decoder) decodeBatch(b *Batch) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	if msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 {
		n, err := d.dec.DecodeMapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			k, ok, err := d.readKey()
			if err != nil {
				return err
			}
			switch {
			case ok && k == "ts":
				if b.TS, err = d.readFloat(); err != nil {
					return err
				}
			case ok && k == "events":
				if err := d.decodeEvents(b); err != nil {
					return err
				}
			case ok && (k == "data_parallel_rank" || k == "attn_dp_rank"):
				if err := d.readRank(b); err != nil {
					return err
				}
			default:
				b.Fields++
				if err := d.skip(); err != nil {
					return err
				}
			}
		}
		return nil
	}
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("batch array of %d elements (want 2 or 3)", n)
	}
	if b.TS, err = d.readFloat(); err != nil {
		return err
	}
	if err := d.decodeEvents(b); err != nil {
		return err
	}
	if n >= 3 {
		if err := d.readRank(b); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ { // a later engine's trailing fields
		b.Fields++
		if err := d.skip(); err != nil {
			return err
		}
	}
	return nil
}

func (d *Decoder) readFloat() (float64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return 0, d.dec.DecodeNil()
	}
	return d.dec.DecodeFloat64() // also accepts ints
}

func (d *Decoder) readRank(b *Batch) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	if c == msgpcode.Nil {
		return d.dec.DecodeNil()
	}
	if !isInt(c) {
		b.Fields++
		return d.skip()
	}
	r, err := d.dec.DecodeInt64()
	if err != nil {
		return err
	}
	if r < 0 || r > math.MaxInt32 {
		return fmt.Errorf("rank %d out of range", r)
	}
	b.Rank, b.HasRank = int(r), true
	return nil
}

func (d *Decoder) decodeEvents(b *Batch) error {
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n > MaxEvents {
		return fmt.Errorf("%w: %d events (max %d)", ErrTooBig, n, MaxEvents)
	}
	for i := 0; i < n; i++ {
		if len(b.Events) < cap(b.Events) {
			b.Events = b.Events[:len(b.Events)+1]
		} else {
			b.Events = append(b.Events, Event{})
		}
		ev := &b.Events[len(b.Events)-1]
		resetEvent(ev)
		if err := d.decodeEvent(ev, b); err != nil {
			return err
		}
		if ev.bad || ev.Kind == KindUnknown {
			switch {
			case ev.Kind == KindUnknown && ev.container && (ev.untagged || ev.bad || len(ev.Hashes) > 0):
				// An unknown kind that names blocks (or has no readable tag) may have
				// removed or moved them: see UnknownRemoving.
				b.Unknown++
				b.UnknownRemoving++
			case ev.bad:
				b.Malformed++
			default: // an unknown kind that names no blocks
				b.Unknown++
			}
			b.Events = b.Events[:len(b.Events)-1]
		}
	}
	return nil
}

func resetEvent(ev *Event) {
	*ev = Event{Hashes: ev.Hashes[:0], Tokens: ev.Tokens[:0], Extra: ev.Extra[:0], extraStr: ev.extraStr[:0]}
}

// decodeEvent reads a tagged positional array or a map keyed by "type". Only a truncated or
// structurally broken stream returns an error; a wrong field type marks the event bad.
func (d *Decoder) decodeEvent(ev *Event, b *Batch) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		ev.container = true
		return d.decodeMapEvent(ev, b)
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		ev.container = true
		return d.decodeArrayEvent(ev, b)
	default:
		ev.bad = true
		return d.skip()
	}
}

func kindOf(tag string) Kind {
	switch tag {
	case "BlockStored":
		return KindStored
	case "BlockRemoved":
		return KindRemoved
	case "AllBlocksCleared":
		return KindCleared
	}
	return KindUnknown
}

// Positional layouts (docs/engine-integration.md): BlockStored [tag, block_hashes, parent,
// token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, spec_kind,
// sliding_window, locality, ownership, session_id]; BlockRemoved [tag, block_hashes, medium,
// group_idx, locality, ownership]; AllBlocksCleared [tag]. The field order is that of vLLM's
// msgspec structs (vllm/distributed/kv_events.py), which array_like encodes positionally.
func (d *Decoder) decodeArrayEvent(ev *Event, b *Batch) error {
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n == 0 {
		ev.bad = true
		return nil
	}
	tag, ok, err := d.readKey()
	if err != nil {
		return err
	}
	if ok {
		ev.Kind = kindOf(tag)
	} else {
		ev.untagged = true
	}
	var known int
	switch ev.Kind {
	case KindStored:
		known = len(storedFields)
	case KindRemoved:
		known = len(removedFields)
	case KindCleared:
		known = 1
	}
	for i := 1; i < n; i++ {
		if ev.Kind == KindUnknown && i == 1 {
			// Both engines keep an event's block hashes at position 1 (BlockStored,
			// BlockRemoved): an unknown kind with a list there names blocks.
			c, err := d.dec.PeekCode()
			if err != nil {
				return err
			}
			if isArray(c) {
				if err := d.readHashes(ev); err != nil {
					return err
				}
				continue
			}
		}
		if ev.Kind == KindUnknown || i >= known {
			if ev.Kind != KindUnknown {
				b.Fields++
			}
			if err := d.skip(); err != nil {
				return err
			}
			continue
		}
		var f string
		if ev.Kind == KindStored {
			f = storedFields[i]
		} else {
			f = removedFields[i]
		}
		if err := d.field(ev, f, b); err != nil {
			return err
		}
	}
	d.finish(ev)
	return nil
}

var (
	storedFields = [...]string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
		"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality", "ownership", "session_id"}
	removedFields = [...]string{"type", "block_hashes", "medium", "group_idx", "locality", "ownership"}
)

func (d *Decoder) decodeMapEvent(ev *Event, b *Batch) error {
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return err
	}
	ev.untagged = true // until a readable "type"
	for i := 0; i < n; i++ {
		k, ok, err := d.readKey()
		if err != nil {
			return err
		}
		if !ok {
			b.Fields++
			if err := d.skip(); err != nil {
				return err
			}
			continue
		}
		if k == "type" {
			tag, ok, err := d.readKey()
			if err != nil {
				return err
			}
			if ok {
				ev.Kind, ev.untagged = kindOf(tag), false
			}
			continue
		}
		if err := d.field(ev, k, b); err != nil {
			return err
		}
	}
	d.finish(ev)
	return nil
}

// field decodes one named field into ev; unknown names are skipped and counted.
func (d *Decoder) field(ev *Event, name string, b *Batch) error {
	switch name {
	case "block_hashes":
		return d.readHashes(ev)
	case "parent_block_hash":
		c, err := d.dec.PeekCode()
		if err != nil {
			return err
		}
		if c == msgpcode.Nil {
			return d.dec.DecodeNil()
		}
		h, ok, err := d.readHash()
		if err != nil {
			return err
		}
		if ok && h == 0 && isInt(c) {
			// "No parent" spelled as the integer 0 rather than nil, in either layout: some
			// publishers do (emulators from the llm-d tooling), and a real 64-bit block hash
			// is 0 with probability 2^-64.
			return nil
		}
		ev.Parent, ev.HasParent, ev.bad = h, ok, ev.bad || !ok
		return nil
	case "token_ids":
		return d.readTokens(ev)
	case "block_size":
		v, ok, err := d.readInt()
		if err != nil {
			return err
		}
		if !ok || v < 0 || v > MaxTokensPerEvent {
			ev.bad = true
		}
		ev.BlockSize = int(v)
		return nil
	case "lora_id":
		v, ok, err := d.readInt()
		if err != nil {
			return err
		}
		ev.LoRAID, ev.HasLoRAID = v, ok
		return nil
	case "medium":
		return d.readMedium(ev)
	case "lora_name":
		c, err := d.dec.PeekCode()
		if err != nil {
			return err
		}
		if isMap(c) { // SGLang between #30827 and #37482: {"cache_salt": …} at position 7
			return d.readSaltMap(ev)
		}
		s, ok, err := d.readString()
		if err != nil {
			return err
		}
		if !ok {
			ev.bad = true
		}
		ev.LoRAName = s
		return nil
	case "extra_keys":
		return d.readExtraKeys(ev)
	case "group_idx":
		v, ok, err := d.readInt()
		if err != nil {
			return err
		}
		if !ok || v < 0 || v > math.MaxUint16 {
			ev.bad = ev.bad || (ok && (v < 0 || v > math.MaxUint16))
			return nil
		}
		ev.Group = int(v)
		return nil
	case "cache_salt":
		c, err := d.dec.PeekCode()
		if err != nil {
			return err
		}
		if c != msgpcode.Nil {
			ev.Salted = true
		}
		return d.skip()
	case "kv_cache_spec_kind":
		c, err := d.dec.PeekCode()
		if err != nil {
			return err
		}
		if c == msgpcode.Nil {
			return d.dec.DecodeNil()
		}
		k, ok, err := d.readKey()
		if err != nil {
			return err
		}
		if ok {
			ev.Spec = specOf(k)
		} else {
			ev.Spec = SpecOther
		}
		return nil
	case "kv_cache_spec_sliding_window":
		v, ok, err := d.readInt()
		if err != nil {
			return err
		}
		if ok && v > 0 && v <= MaxTokensPerEvent*64 {
			ev.Window = int(v)
		}
		return nil
	case "locality":
		return d.readLocality(ev, b)
	case "session_id", "ownership":
		// Known and not needed: the request behind a store, and which secondary offloading
		// tier made the copy (the medium and locality already say where it is).
		return d.skip()
	default:
		b.Fields++
		return d.skip()
	}
}

// finish checks what only the whole event can tell.
func (d *Decoder) finish(ev *Event) {
	// The locality qualifies the medium, whichever came first (a map has no order): a REMOTE
	// copy is on another host whatever its medium, so it is never the node's GPU.
	if ev.Locality == LocalityRemote {
		ev.Tier = TierRemote
	}
	if ev.Kind != KindStored || ev.bad {
		return
	}
	if len(ev.Extra) != 0 && len(ev.Extra) != len(ev.Hashes) {
		ev.bad = true // extra_keys must line up with block_hashes
		return
	}
	if ev.LoRAName != "" && len(ev.Extra) > 0 {
		nameHash := xxhash.Sum64String(ev.LoRAName)
		for i, x := range ev.Extra {
			if x == extraLoRA && ev.extraStr[i] != nameHash {
				ev.Extra[i] = extraOther
			}
		}
	} else {
		for i, x := range ev.Extra {
			if x == extraLoRA { // a one-string key that is not this request's LoRA
				ev.Extra[i] = extraOther
			}
		}
	}
}
