package extproc

import (
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// The endpoint picker's gRPC server encodes and decodes with wireCodec and reads frames into
// dirtyPool's buffers instead of gRPC's defaults (GRPCOptions). gRPC's default buffer pool clears
// every buffer it hands out to the buffer's whole capacity, and its classes jump from 32 KiB to
// 1 MiB: each FULL_DUPLEX_STREAMED answer carrying a body chunk (up to 62,000 bytes) cleared
// 1 MiB, and each request chunk that spans two HTTP/2 frames 32 KiB, before being overwritten.
// That clearing was the largest single cost of the picker's answer (docs/gateway.md, "Cost of
// the picker"). Every buffer here is written in full before it is read (a marshal of exactly
// its size, a frame read of exactly its length), so none needs clearing.

// dirtyPool is a mem.BufferPool of power-of-two classes from 256 bytes to 1 MiB that hands out
// buffers as they were left; larger buffers are allocated per use.
var dirtyPool = &classPool{}

const (
	minPoolBits = 8  // 256 B: gRPC pools nothing smaller (mem.IsBelowBufferPoolingThreshold)
	maxPoolBits = 20 // 1 MiB
)

type classPool struct {
	classes [maxPoolBits - minPoolBits + 1]sync.Pool // *[]byte of cap 1<<(i+minPoolBits)
}

var _ mem.BufferPool = (*classPool)(nil)

// class is the index of the smallest class holding n bytes, or -1 above the largest.
func (p *classPool) class(n int) int {
	c := max(bits.Len(uint(max(n, 1)-1)), minPoolBits) - minPoolBits
	if c >= len(p.classes) {
		return -1
	}
	return c
}

// Get returns a buffer of length n whose contents are whatever it held before.
func (p *classPool) Get(n int) *[]byte {
	c := p.class(n)
	if c < 0 {
		b := make([]byte, n)
		return &b
	}
	if b, _ := p.classes[c].Get().(*[]byte); b != nil {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(c+minPoolBits))
	return &b
}

// Put returns b to its class; a buffer whose capacity is not exactly a class is left to the
// collector.
func (p *classPool) Put(b *[]byte) {
	n := cap(*b)
	if n == 0 || n&(n-1) != 0 {
		return
	}
	if c := bits.Len(uint(n)) - 1 - minPoolBits; c >= 0 && c < len(p.classes) {
		p.classes[c].Put(b)
	}
}

// wireCodec is gRPC's proto codec (encoding/proto) over dirtyPool.
type wireCodec struct{}

func (wireCodec) Name() string { return "proto" }

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("extproc: cannot marshal %T: not a proto message", v)
	}
	// UseCachedSize reuses the sizes Size just computed (the message is not changed between).
	opts := proto.MarshalOptions{UseCachedSize: true}
	size := opts.Size(m)
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := dirtyPool.Get(size)
	out, err := opts.MarshalAppend((*buf)[:0], m)
	if err != nil {
		dirtyPool.Put(buf)
		return nil, err
	}
	if len(out) != size || &out[0] != &(*buf)[0] { // never: the buffer is the message's size
		dirtyPool.Put(buf)
		return mem.BufferSlice{mem.SliceBuffer(out)}, nil
	}
	return mem.BufferSlice{mem.NewBuffer(buf, dirtyPool)}, nil
}

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("extproc: cannot unmarshal into %T: not a proto message", v)
	}
	if len(data) == 1 { // the message in one frame: read it where it is
		return proto.Unmarshal(data[0].ReadOnlyData(), m)
	}
	buf := data.MaterializeToBuffer(dirtyPool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}
