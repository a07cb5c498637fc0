package kvevents

// The field readers: each reads one value of the expected type, or skips a value of another type
// and reports it (the event is then malformed), so that a wrong field never desynchronises the
// stream.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

func isMap(c byte) bool { return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 }

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isStrOrBin(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32 ||
		c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32
}

// readKey reads a short string (a map key or a tag) into the scratch buffer without allocating;
// ok is false (and the value consumed) for anything else or anything longer than maxKeyBytes.
// The returned string aliases scratch: compare it, don't keep it.
func (d *Decoder) readKey() (string, bool, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return "", false, err
	}
	if !isStrOrBin(c) {
		return "", false, d.skip()
	}
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return "", false, err
	}
	if n > maxKeyBytes {
		return "", false, d.skipBytes(n)
	}
	if err := d.dec.ReadFull(d.key[:n]); err != nil {
		return "", false, err
	}
	return unsafeString(d.key[:n]), true, nil
}

func (d *Decoder) skipBytes(n int) error {
	if n > d.r.Len() {
		return fmt.Errorf("string of %d bytes past the end", n)
	}
	_, err := d.r.Seek(int64(n), 1)
	return err
}

// readString reads a nil or a string up to maxNameBytes (interned); ok is false for another type.
func (d *Decoder) readString() (string, bool, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return "", false, err
	}
	if c == msgpcode.Nil {
		return "", true, d.dec.DecodeNil()
	}
	if !isStrOrBin(c) {
		return "", false, d.skip()
	}
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return "", false, err
	}
	if n > maxNameBytes {
		return "", false, d.skipBytes(n)
	}
	var buf [maxNameBytes]byte
	if err := d.dec.ReadFull(buf[:n]); err != nil {
		return "", false, err
	}
	if s, ok := d.names[string(buf[:n])]; ok {
		return s, true, nil
	}
	s := string(buf[:n])
	if len(d.names) < maxInternedNames {
		d.names[s] = s
	}
	return s, true, nil
}

// maxInternedNames bounds the LoRA-name intern table: a node serves at most a few hundred adapters.
const maxInternedNames = 4096

// readInt reads a nil (ok false) or an integer of any width; another type is skipped (ok false).
func (d *Decoder) readInt() (int64, bool, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	if !isInt(c) {
		return 0, false, d.skip()
	}
	v, err := d.dec.DecodeInt64()
	return v, err == nil, err
}

// readHash reads one block hash: an int of any width or bin/str bytes (last 8 bytes).
func (d *Decoder) readHash() (uint64, bool, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case isInt(c):
		v, err := d.dec.DecodeUint64() // two's complement for signed widths
		return v, err == nil, err
	case isStrOrBin(c):
		n, err := d.dec.DecodeBytesLen()
		if err != nil {
			return 0, false, err
		}
		if n > maxKeyBytes || n == 0 {
			return 0, false, d.skipBytes(n)
		}
		if err := d.dec.ReadFull(d.key[:n]); err != nil {
			return 0, false, err
		}
		return bytesKey(d.key[:n]), true, nil
	default:
		return 0, false, d.skip()
	}
}

// bytesKey is the last 8 bytes big-endian, zero-padded on the left when shorter: for a digest,
// exactly vLLM's maybe_convert_block_hash int mode.
func bytesKey(b []byte) uint64 {
	var k [8]byte
	if len(b) >= 8 {
		copy(k[:], b[len(b)-8:])
	} else {
		copy(k[8-len(b):], b)
	}
	return binary.BigEndian.Uint64(k[:])
}

// eventListLen opens a list field of an event and returns its length. A value that is not a
// list marks the event bad and is skipped (ok false); a list longer than max fails the batch with
// ErrTooBig naming what, before anything of it is read.
func (d *Decoder) eventListLen(ev *Event, max int, what string) (n int, ok bool, err error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	if !isArray(c) {
		ev.bad = true
		return 0, false, d.skip()
	}
	if n, err = d.dec.DecodeArrayLen(); err != nil {
		return 0, false, err
	}
	if n > max {
		return 0, false, fmt.Errorf("%w: %d %s (max %d)", ErrTooBig, n, what, max)
	}
	return n, true, nil
}

func (d *Decoder) readHashes(ev *Event) error {
	n, ok, err := d.eventListLen(ev, MaxBlocksPerEvent, "block hashes")
	if !ok || err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		h, ok, err := d.readHash()
		if err != nil {
			return err
		}
		if !ok {
			ev.bad = true
			continue
		}
		ev.Hashes = append(ev.Hashes, h)
	}
	return nil
}

func (d *Decoder) readTokens(ev *Event) error {
	n, ok, err := d.eventListLen(ev, MaxTokensPerEvent, "tokens")
	if !ok || err != nil {
		return err
	}
	if n > d.r.Len() { // every token takes at least one byte
		return fmt.Errorf("%d tokens past the end", n)
	}
	for i := 0; i < n; i++ {
		c, err := d.dec.PeekCode()
		if err != nil {
			return err
		}
		if !isInt(c) {
			ev.bad = true
			if err := d.skip(); err != nil {
				return err
			}
			continue
		}
		v, err := d.dec.DecodeInt64()
		if err != nil {
			return err
		}
		if v < 0 || v > math.MaxUint32 {
			ev.bad = true
			continue
		}
		ev.Tokens = append(ev.Tokens, uint32(v))
	}
	return nil
}

func (d *Decoder) readMedium(ev *Event) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	if c == msgpcode.Nil {
		ev.Tier = TierGPU
		return d.dec.DecodeNil()
	}
	m, ok, err := d.readKey()
	if err != nil {
		return err
	}
	if !ok {
		ev.Tier = TierOther
		return nil
	}
	ev.Tier = tierOf(m)
	return nil
}

// tierOf normalises a medium case-insensitively (llm-d lowercases too; vLLM spells its disk
// medium "Disk"). "STORAGE" is vLLM's unified tiering medium: TierStorage until a REMOTE
// locality moves it (finish).
func tierOf(m string) Tier {
	switch {
	case m == "" || equalFold(m, "GPU"):
		return TierGPU
	case equalFold(m, "DISK"):
		return TierDisk
	case equalFold(m, "STORAGE"):
		return TierStorage
	case len(m) >= 3 && equalFold(m[:3], "CPU"):
		return TierCPU
	}
	return TierOther
}

// readLocality reads vLLM's "locality": nil, "LOCAL" or "REMOTE" (case-insensitive). Any other
// value is skipped and counted as an unknown field: vLLM defines no other, and a later field in
// that position of a publisher's own must not move a copy off the GPU.
func (d *Decoder) readLocality(ev *Event, b *Batch) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	if c == msgpcode.Nil {
		ev.Locality = LocalityUnset
		return d.dec.DecodeNil()
	}
	l, ok, err := d.readKey()
	if err != nil {
		return err
	}
	switch {
	case ok && equalFold(l, "LOCAL"):
		ev.Locality = LocalityLocal
	case ok && equalFold(l, "REMOTE"):
		ev.Locality = LocalityRemote
	default:
		b.Fields++
	}
	return nil
}

func equalFold(a, b string) bool { return bytes.EqualFold([]byte(a), []byte(b)) }

// readExtraKeys reads extra_keys: nil, or one entry per block, each nil or a tuple.
func (d *Decoder) readExtraKeys(ev *Event) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	if c == msgpcode.Nil {
		return d.dec.DecodeNil()
	}
	n, ok, err := d.eventListLen(ev, MaxBlocksPerEvent, "extra keys")
	if !ok || err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		c, err := d.dec.PeekCode()
		if err != nil {
			return err
		}
		class, strHash := extraOther, uint64(0)
		switch {
		case c == msgpcode.Nil:
			class = extraNone
			if err := d.dec.DecodeNil(); err != nil {
				return err
			}
		case isArray(c):
			m, err := d.dec.DecodeArrayLen()
			if err != nil {
				return err
			}
			for j := 0; j < m; j++ {
				c, err := d.dec.PeekCode()
				if err != nil {
					return err
				}
				if m == 1 && isStrOrBin(c) {
					s, ok, err := d.readKeyHash()
					if err != nil {
						return err
					}
					if ok {
						class, strHash = extraLoRA, s
					}
					continue
				}
				if err := d.skip(); err != nil {
					return err
				}
			}
			if m == 0 {
				class = extraNone
			}
		default:
			if err := d.skip(); err != nil {
				return err
			}
		}
		ev.Extra = append(ev.Extra, class)
		ev.extraStr = append(ev.extraStr, strHash)
	}
	return nil
}

// readKeyHash reads a string and returns its xxhash (any length up to maxNameBytes).
func (d *Decoder) readKeyHash() (uint64, bool, error) {
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return 0, false, err
	}
	if n < 0 || n > maxNameBytes {
		return 0, false, d.skipBytes(max(n, 0))
	}
	var buf [maxNameBytes]byte
	if err := d.dec.ReadFull(buf[:n]); err != nil {
		return 0, false, err
	}
	return xxhash.Sum64(buf[:n]), true, nil
}

// readSaltMap reads SGLang's positional metadata map; a non-nil cache_salt salts the event.
func (d *Decoder) readSaltMap(ev *Event) error {
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		k, ok, err := d.readKey()
		if err != nil {
			return err
		}
		c, err := d.dec.PeekCode()
		if err != nil {
			return err
		}
		if ok && k == "cache_salt" && c != msgpcode.Nil {
			ev.Salted = true
		}
		if err := d.skip(); err != nil {
			return err
		}
	}
	return nil
}
