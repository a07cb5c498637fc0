package local

import (
	"encoding/binary"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// The canonical block hash, shared by the node-local tree, its summary journal and
// the router's index, so that a router can compute from a prompt exactly the keys a node reports:
//
//	seed(adapter) = 0 if adapter == 0, else xxhash64(LE64(adapter))
//	h[0]          = xxhash64(LE64(seed)   ‖ LE32(tok[0]) ‖ … ‖ LE32(tok[bs-1]))
//	h[i]          = xxhash64(LE64(h[i-1]) ‖ LE32(tok[i·bs]) ‖ … ‖ LE32(tok[i·bs+bs-1]))
//
// One hash per full block; a trailing partial block has none.

// littleEndian reports whether uint32 slices can be hashed as their in-memory bytes.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// AdapterSeed returns the chain seed for an adapter: 0 for the base model.
func AdapterSeed(adapterID uint64) uint64 {
	if adapterID == 0 {
		return 0
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], adapterID)
	return xxhash.Sum64(b[:])
}

// AdapterIDOf is the adapter id for a LoRA name, the id routers seed block hashes with: 0 for the
// base model (""), the number itself for a decimal name (name the engine's LoRA modules by their
// prefixmesh adapter id, e.g. vLLM `--lora-modules 7=/path`, and requests for model "<base>:7"
// hash alike), else a stable 64-bit hash of the name with the top bit set.
func AdapterIDOf(name string) uint64 {
	if name == "" {
		return 0
	}
	var v uint64
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < '0' || c > '9' || v > (1<<64-1-9)/10 {
			return xxhash.Sum64String(name) | 1<<63
		}
		v = v*10 + uint64(c-'0')
	}
	return v
}

// maxStackChunk is the largest block (in tokens) hashed in one xxhash.Sum64 call over a stack
// buffer; one-shot hashing is about a quarter faster than the streaming Digest, and 64 tokens
// covers every block size engines use (16 and 32 are typical). Larger blocks stream.
const maxStackChunk = 64

// ChainHash returns the hash of one block given its parent's hash (or the adapter seed for the
// first block). It does not allocate.
func ChainHash(parent uint64, chunk []uint32) uint64 {
	if littleEndian && len(chunk) > 0 && len(chunk) <= maxStackChunk {
		var buf [8 + 4*maxStackChunk]byte
		binary.LittleEndian.PutUint64(buf[:8], parent)
		n := 8 + copy(buf[8:], unsafe.Slice((*byte)(unsafe.Pointer(&chunk[0])), len(chunk)*4))
		return xxhash.Sum64(buf[:n])
	}
	var d xxhash.Digest
	d.Reset()
	var p [8]byte
	binary.LittleEndian.PutUint64(p[:], parent)
	_, _ = d.Write(p[:])
	if len(chunk) == 0 {
		return d.Sum64()
	}
	if littleEndian {
		_, _ = d.Write(unsafe.Slice((*byte)(unsafe.Pointer(&chunk[0])), len(chunk)*4))
		return d.Sum64()
	}
	var buf [256]byte
	for len(chunk) > 0 {
		n := min(len(chunk), len(buf)/4)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(buf[i*4:], chunk[i])
		}
		_, _ = d.Write(buf[:n*4])
		chunk = chunk[n:]
	}
	return d.Sum64()
}

// AppendBlockHashes appends the canonical hash of every full block of tokens to dst and returns
// the extended slice. With enough capacity in dst it does not allocate. A blockSize <= 0 appends
// nothing.
func AppendBlockHashes(dst []uint64, tokens []uint32, blockSize int, adapterID uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	h := AdapterSeed(adapterID)
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		h = ChainHash(h, tokens[i:i+blockSize])
		dst = append(dst, h)
	}
	return dst
}

// BlockHashes returns the canonical hash of every full block of tokens.
func BlockHashes(tokens []uint32, blockSize int, adapterID uint64) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	return AppendBlockHashes(make([]uint64, 0, len(tokens)/blockSize), tokens, blockSize, adapterID)
}
