package pins

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// commandVersion is the first byte of every encoded command. A replica refuses (as a failed
// Apply result, never a panic) a version it does not know, so a newer writer cannot silently
// corrupt an older replica's table during a rolling upgrade.
const commandVersion byte = 1

// Op is a command's operation.
type Op uint8

// Operations. Values are part of the log format: never renumber.
const (
	OpPutAdapter    Op = 1
	OpDeleteAdapter Op = 2
	OpPinAdapter    Op = 3
	OpUnpinAdapter  Op = 4
	OpPinPrefix     Op = 5
	OpUnpinPrefix   Op = 6
	// OpSetServer records a Raft server's gRPC address, so followers can forward to the leader.
	OpSetServer Op = 7
)

func (o Op) String() string {
	switch o {
	case OpPutAdapter:
		return "put-adapter"
	case OpDeleteAdapter:
		return "delete-adapter"
	case OpPinAdapter:
		return "pin-adapter"
	case OpUnpinAdapter:
		return "unpin-adapter"
	case OpPinPrefix:
		return "pin-prefix"
	case OpUnpinPrefix:
		return "unpin-prefix"
	case OpSetServer:
		return "set-server"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Cond is an optional compare-and-set condition: when Set, the write applies only if the entry's
// current version equals Version (0: the entry must not exist).
type Cond struct {
	Set     bool
	Version uint64
}

// IfVersion returns the condition "current version == v".
func IfVersion(v uint64) Cond { return Cond{Set: true, Version: v} }

// Command is one write to the pin table. Build it, call Normalize and Validate (Store does both
// before proposing), then Encode.
type Command struct {
	Op         Op
	Adapter    Adapter  // OpPutAdapter (Version ignored)
	AdapterID  uint64   // every op but OpPutAdapter and OpSetServer
	Nodes      []string // OpPinAdapter, OpPinPrefix
	Tokens     []uint32 // OpPinPrefix; OpUnpinPrefix (or PrefixHash)
	PrefixHash uint64   // OpUnpinPrefix without Tokens
	Cond       Cond
	ServerID   string // OpSetServer
	Addr       string // OpSetServer
}

// Normalize puts a command in canonical form: nodes sorted and de-duplicated, the prefix hash
// computed from the tokens.
func (c *Command) Normalize() {
	if c.Nodes != nil {
		c.Nodes = normalizeNodes(c.Nodes)
	}
	if (c.Op == OpPinPrefix || c.Op == OpUnpinPrefix) && len(c.Tokens) > 0 {
		c.PrefixHash = PrefixHash(c.AdapterID, c.Tokens)
	}
}

// Validate checks a normalized command against the caps. Errors wrap ErrInvalid.
func (c *Command) Validate() error {
	switch c.Op {
	case OpPutAdapter:
		return validateAdapter(c.Adapter)
	case OpDeleteAdapter, OpUnpinAdapter:
		return checkAdapterID(c.AdapterID)
	case OpPinAdapter:
		if err := checkAdapterID(c.AdapterID); err != nil {
			return err
		}
		return checkNodes(c.Nodes)
	case OpPinPrefix:
		if err := checkAdapterID(c.AdapterID); err != nil {
			return err
		}
		if err := checkTokens(c.Tokens); err != nil {
			return err
		}
		if c.PrefixHash != PrefixHash(c.AdapterID, c.Tokens) {
			return fmt.Errorf("%w: prefix hash does not match the tokens", ErrInvalid)
		}
		return checkNodes(c.Nodes)
	case OpUnpinPrefix:
		if err := checkAdapterID(c.AdapterID); err != nil {
			return err
		}
		if len(c.Tokens) > 0 {
			if err := checkTokens(c.Tokens); err != nil {
				return err
			}
			if c.PrefixHash != PrefixHash(c.AdapterID, c.Tokens) {
				return fmt.Errorf("%w: prefix hash does not match the tokens", ErrInvalid)
			}
		}
		return nil
	case OpSetServer:
		if err := checkText("server id", c.ServerID, MaxNodeIDLen, true); err != nil {
			return err
		}
		return checkText("server address", c.Addr, MaxServerAddrLen, true)
	}
	return fmt.Errorf("%w: unknown operation %d", ErrInvalid, uint8(c.Op))
}

// Encode returns the wire form: commandVersion, Op, then the op's fields in a fixed order
// (uvarints, length-prefixed strings and lists).
func (c *Command) Encode() []byte {
	var e encoder
	e.u8(commandVersion)
	e.u8(byte(c.Op))
	e.cond(c.Cond)
	switch c.Op {
	case OpPutAdapter:
		e.uvarint(c.Adapter.ID)
		e.str(c.Adapter.Name)
		e.str(c.Adapter.BaseModel)
		e.str(c.Adapter.Revision)
	case OpDeleteAdapter, OpUnpinAdapter:
		e.uvarint(c.AdapterID)
	case OpPinAdapter:
		e.uvarint(c.AdapterID)
		e.strs(c.Nodes)
	case OpPinPrefix:
		e.uvarint(c.AdapterID)
		e.u32s(c.Tokens)
		e.strs(c.Nodes)
	case OpUnpinPrefix:
		e.uvarint(c.AdapterID)
		e.u64(c.PrefixHash)
		e.u32s(c.Tokens)
	case OpSetServer:
		e.str(c.ServerID)
		e.str(c.Addr)
	}
	return e.b
}

// DecodeCommand parses and validates an encoded command. It never panics; anything it accepts
// is safe to apply.
func DecodeCommand(b []byte) (Command, error) {
	var c Command
	if len(b) > MaxCommandBytes {
		return c, fmt.Errorf("%w: command is %d bytes, over the limit of %d", ErrInvalid, len(b), MaxCommandBytes)
	}
	d := decoder{b: b}
	if v := d.u8(); d.err == nil && v != commandVersion {
		return c, fmt.Errorf("%w: unknown command version %d", ErrInvalid, v)
	}
	c.Op = Op(d.u8())
	c.Cond = d.cond()
	switch c.Op {
	case OpPutAdapter:
		c.Adapter.ID = d.uvarint()
		c.Adapter.Name = d.str(MaxNameLen)
		c.Adapter.BaseModel = d.str(MaxBaseModelLen)
		c.Adapter.Revision = d.str(MaxRevisionLen)
	case OpDeleteAdapter, OpUnpinAdapter:
		c.AdapterID = d.uvarint()
	case OpPinAdapter:
		c.AdapterID = d.uvarint()
		c.Nodes = d.strs(MaxPinNodes, MaxNodeIDLen)
	case OpPinPrefix:
		c.AdapterID = d.uvarint()
		c.Tokens = d.u32s(MaxPrefixTokens)
		c.Nodes = d.strs(MaxPinNodes, MaxNodeIDLen)
		c.PrefixHash = PrefixHash(c.AdapterID, c.Tokens)
	case OpUnpinPrefix:
		c.AdapterID = d.uvarint()
		c.PrefixHash = d.u64()
		c.Tokens = d.u32s(MaxPrefixTokens)
	case OpSetServer:
		c.ServerID = d.str(MaxNodeIDLen)
		c.Addr = d.str(MaxServerAddrLen)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(d.b))
	}
	if d.err != nil {
		return Command{}, fmt.Errorf("decode command: %w", d.err)
	}
	if err := c.Validate(); err != nil {
		return Command{}, err
	}
	return c, nil
}

// Result is what applying a command produced: the log index, the entry's new version (0 after a
// delete) and the failure, if any. Err is one of the sentinels or a *VersionError.
type Result struct {
	Index   uint64
	Version uint64
	Err     error
}

// Result error codes on the wire (forwarding between members).
const (
	resOK byte = iota
	resVersion
	resNotFound
	resInvalid
	resLimit
	resCorrupt
)

// resultVersion is the first byte of an encoded Result.
const resultVersion byte = 1

// encodeResult returns the wire form of r for PinsPeer.Propose.
func encodeResult(r Result) []byte {
	var e encoder
	e.u8(resultVersion)
	code, current := resOK, uint64(0)
	var ve *VersionError
	switch {
	case r.Err == nil:
	case errors.As(r.Err, &ve):
		code, current = resVersion, ve.Current
	case errors.Is(r.Err, ErrNotFound):
		code = resNotFound
	case errors.Is(r.Err, ErrLimit):
		code = resLimit
	case errors.Is(r.Err, ErrCorrupt):
		code = resCorrupt
	default:
		code = resInvalid
	}
	e.u8(code)
	e.uvarint(r.Index)
	e.uvarint(r.Version)
	e.uvarint(current)
	msg := ""
	if r.Err != nil {
		msg = r.Err.Error()
	}
	e.str(msg)
	return e.b
}

// decodeResult parses encodeResult's output, restoring the sentinel identity of the error.
func decodeResult(b []byte) (Result, error) {
	d := decoder{b: b}
	if v := d.u8(); d.err == nil && v != resultVersion {
		return Result{}, fmt.Errorf("%w: unknown result version %d", ErrCorrupt, v)
	}
	code := d.u8()
	r := Result{Index: d.uvarint(), Version: d.uvarint()}
	current := d.uvarint()
	msg := d.str(MaxCommandBytes)
	if d.err != nil {
		return Result{}, fmt.Errorf("decode result: %w", d.err)
	}
	switch code {
	case resOK:
	case resVersion:
		r.Err = &VersionError{Current: current, Expected: expectedFromMsg(msg)}
	case resNotFound:
		r.Err = fmt.Errorf("%w (%s)", ErrNotFound, msg)
	case resLimit:
		r.Err = fmt.Errorf("%w (%s)", ErrLimit, msg)
	case resCorrupt:
		r.Err = fmt.Errorf("%w (%s)", ErrCorrupt, msg)
	default:
		r.Err = fmt.Errorf("%w (%s)", ErrInvalid, msg)
	}
	return r, nil
}

// expectedFromMsg recovers VersionError.Expected from its message (informational only).
func expectedFromMsg(msg string) uint64 {
	var exp, cur uint64
	if _, err := fmt.Sscanf(msg, "pins: version mismatch: expected %d, current %d", &exp, &cur); err != nil {
		return 0
	}
	return exp
}

// encoder appends the primitive wire types.
type encoder struct{ b []byte }

func (e *encoder) u8(v byte)        { e.b = append(e.b, v) }
func (e *encoder) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) u64(v uint64)     { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) str(s string)     { e.uvarint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *encoder) strs(ss []string) {
	e.uvarint(uint64(len(ss)))
	for _, s := range ss {
		e.str(s)
	}
}
func (e *encoder) u32s(ts []uint32) {
	e.uvarint(uint64(len(ts)))
	for _, t := range ts {
		e.uvarint(uint64(t))
	}
}
func (e *encoder) cond(c Cond) {
	if !c.Set {
		e.u8(0)
		return
	}
	e.u8(1)
	e.uvarint(c.Version)
}

// decoder consumes the primitive wire types; the first error sticks and later reads return zero
// values, so callers check d.err once.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	}
}

func (d *decoder) u8() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) u64() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// count reads a list length, refusing one above max or longer than the remaining bytes could
// hold (each element takes at least minBytes), so a forged length cannot force a huge allocation.
func (d *decoder) count(max, minBytes int) int {
	n := d.uvarint()
	if d.err != nil {
		return 0
	}
	if n > uint64(max) || n*uint64(minBytes) > uint64(len(d.b)) {
		d.fail("list of %d elements exceeds its limit or the data", n)
		return 0
	}
	return int(n)
}

func (d *decoder) str(max int) string {
	n := d.count(max, 1)
	if d.err != nil {
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) strs(maxN, maxLen int) []string {
	n := d.count(maxN, 1)
	if d.err != nil || n == 0 {
		return nil
	}
	out := make([]string, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, d.str(maxLen))
	}
	return out
}

func (d *decoder) u32s(max int) []uint32 {
	n := d.count(max, 1)
	if d.err != nil || n == 0 {
		return nil
	}
	out := make([]uint32, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		v := d.uvarint()
		if v > 0xFFFFFFFF {
			d.fail("token %d out of range", v)
		}
		out = append(out, uint32(v))
	}
	return out
}

func (d *decoder) cond() Cond {
	switch d.u8() {
	case 0:
		return Cond{}
	case 1:
		return Cond{Set: true, Version: d.uvarint()}
	}
	d.fail("bad condition flag")
	return Cond{}
}
