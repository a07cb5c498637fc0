package node

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// invalidCase is one request the edge must reject, and what the status message must name.
type invalidCase struct {
	name string
	call func(context.Context, pb.NodeCacheClient) error
	want []string // substrings of the status message: the field and its value
}

func invalidCases() []invalidCase {
	p := prompt(1, 8)
	tooMany := make([]uint32, MaxTokens+1)
	lookup := func(r *pb.LookupRequest) func(context.Context, pb.NodeCacheClient) error {
		return func(ctx context.Context, c pb.NodeCacheClient) error { _, err := c.Lookup(ctx, r); return err }
	}
	insert := func(r *pb.InsertRequest) func(context.Context, pb.NodeCacheClient) error {
		return func(ctx context.Context, c pb.NodeCacheClient) error { _, err := c.Insert(ctx, r); return err }
	}
	return []invalidCase{
		{"Lookup block_size 0", lookup(&pb.LookupRequest{Tokens: p}), []string{"block_size = 0"}},
		{"Lookup block_size negative", lookup(&pb.LookupRequest{Tokens: p, BlockSize: -16}), []string{"block_size = -16"}},
		{"Lookup block_size over MaxBlockSize", lookup(&pb.LookupRequest{Tokens: p, BlockSize: MaxBlockSize + 1}), []string{"block_size = 4097"}},
		{"Lookup tokens over MaxTokens", lookup(&pb.LookupRequest{Tokens: tooMany, BlockSize: 16}), []string{"tokens", "1048577 tokens"}},
		// (A Peek without block_size is read with the node's: TestPeekUsesNodeBlockSize.)
		{"Peek block_size over MaxBlockSize", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: p, BlockSize: MaxBlockSize + 1})
			return err
		}, []string{"block_size = 4097"}},
		{"Peek tokens over MaxTokens", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: tooMany, BlockSize: 16})
			return err
		}, []string{"tokens", "1048577"}},
		{"PinPrefix block_size negative", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.PinPrefix(ctx, &pb.PinPrefixRequest{Tokens: p, BlockSize: -1})
			return err
		}, []string{"block_size = -1"}},
		{"Insert block_size 0", insert(&pb.InsertRequest{Tokens: p, BlockTable: []uint32{1}}), []string{"block_size = 0"}},
		{"Insert block_table too long", insert(&pb.InsertRequest{Tokens: p, BlockTable: []uint32{1, 2, 3}, BlockSize: 4}),
			[]string{"block_table", "3 entries", "= 2"}},
		{"Insert block_table too long for partial", insert(&pb.InsertRequest{Tokens: p[:5], BlockTable: []uint32{1, 2, 3}, BlockSize: 4}),
			[]string{"block_table", "3 entries"}},
		{"Insert block_table for no tokens", insert(&pb.InsertRequest{BlockTable: []uint32{1}, BlockSize: 4}), []string{"block_table", "1 entries"}},
		{"Insert block_table NoBlock", insert(&pb.InsertRequest{Tokens: p, BlockTable: []uint32{1, local.NoBlock}, BlockSize: 4}),
			[]string{"block_table[1] = 4294967295"}},
		{"Insert disk_block_ids shorter", insert(&pb.InsertRequest{Tokens: p, BlockTable: []uint32{1, 2}, DiskBlockIds: []uint32{7}, BlockSize: 4}),
			[]string{"disk_block_ids", "1 entries"}},
		{"Insert disk_block_ids longer", insert(&pb.InsertRequest{Tokens: p, BlockTable: []uint32{1}, DiskBlockIds: []uint32{7, 8}, BlockSize: 4}),
			[]string{"disk_block_ids", "2 entries"}},
		{"Insert matched_tokens negative", insert(&pb.InsertRequest{Tokens: p, BlockTable: []uint32{1}, BlockSize: 4, MatchedTokens: -4}),
			[]string{"matched_tokens = -4"}},
		{"Insert matched_tokens beyond tokens", insert(&pb.InsertRequest{Tokens: p, BlockTable: []uint32{1}, BlockSize: 4, MatchedTokens: 9}),
			[]string{"matched_tokens = 9"}},
		{"Insert tokens over MaxTokens", insert(&pb.InsertRequest{Tokens: tooMany, BlockSize: 16}), []string{"tokens", "1048577"}},
		{"InsertWithSnapshot snapshot_id negative", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.InsertWithSnapshot(ctx, &pb.InsertWithSnapshotRequest{Tokens: p, BlockTable: []uint32{1}, BlockSize: 4, SnapshotId: -1})
			return err
		}, []string{"snapshot_id = -1"}},
		{"InsertWithSnapshot block_table NoBlock", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.InsertWithSnapshot(ctx, &pb.InsertWithSnapshotRequest{Tokens: p, BlockTable: []uint32{local.NoBlock}, BlockSize: 4})
			return err
		}, []string{"block_table[0] = 4294967295"}},
		{"InsertIntermediateSnapshot snapshot_id negative", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.InsertIntermediateSnapshot(ctx, &pb.InsertIntermediateSnapshotRequest{Tokens: p, SnapshotId: -2})
			return err
		}, []string{"snapshot_id = -2"}},
		{"InsertIntermediateSnapshot snapshot_id over MaxSlot", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.InsertIntermediateSnapshot(ctx, &pb.InsertIntermediateSnapshotRequest{Tokens: p, SnapshotId: MaxSlot + 1})
			return err
		}, []string{"snapshot_id = 2147483648"}},
		{"InsertIntermediateSnapshot half-set tree fields", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.InsertIntermediateSnapshot(ctx, &pb.InsertIntermediateSnapshotRequest{Tokens: p, BlockTable: []uint32{1}})
			return err
		}, []string{"block_size = 0"}},
		{"InsertTailSnapshot snapshot_id negative", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.InsertTailSnapshot(ctx, &pb.InsertTailSnapshotRequest{Tokens: p, SnapshotId: -3})
			return err
		}, []string{"snapshot_id = -3"}},
		{"InsertTailSnapshot tokens over MaxTokens", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.InsertTailSnapshot(ctx, &pb.InsertTailSnapshotRequest{Tokens: tooMany})
			return err
		}, []string{"tokens", "1048577"}},
		{"InsertTailSiblingSnapshot snapshot_id negative", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.InsertTailSiblingSnapshot(ctx, &pb.InsertTailSiblingSnapshotRequest{Tokens: p, SnapshotId: -4})
			return err
		}, []string{"snapshot_id = -4"}},
		{"Release block_size 0", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.Release(ctx, &pb.ReleaseRequest{Tokens: p})
			return err
		}, []string{"block_size = 0"}},
		{"ReleaseMatched block_size over MaxBlockSize", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.ReleaseMatched(ctx, &pb.ReleaseMatchedRequest{Tokens: p, BlockSize: 1 << 20})
			return err
		}, []string{"block_size = 1048576"}},
		{"ReleaseMatched matched_tokens beyond tokens", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.ReleaseMatched(ctx, &pb.ReleaseMatchedRequest{Tokens: p, BlockSize: 4, MatchedTokens: 100})
			return err
		}, []string{"matched_tokens = 100"}},
		{"ReleaseMatched matched_tokens negative", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.ReleaseMatched(ctx, &pb.ReleaseMatchedRequest{Tokens: p, BlockSize: 4, MatchedTokens: -1})
			return err
		}, []string{"matched_tokens = -1"}},
		{"Evict num_blocks negative", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.Evict(ctx, &pb.EvictRequest{NumBlocks: -1})
			return err
		}, []string{"num_blocks = -1"}},
		{"Evict num_blocks over MaxEvictBlocks", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.Evict(ctx, &pb.EvictRequest{NumBlocks: MaxEvictBlocks + 1})
			return err
		}, []string{"num_blocks = 1048577"}},
		{"Evict num_blocks absurd", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.Evict(ctx, &pb.EvictRequest{NumBlocks: math.MaxInt64})
			return err
		}, []string{fmt.Sprintf("num_blocks = %d", int64(math.MaxInt64))}},
		{"EvictSnapshotSlot slot negative", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.EvictSnapshotSlot(ctx, &pb.EvictSnapshotSlotRequest{Slot: -5})
			return err
		}, []string{"slot = -5"}},
		{"EvictSnapshotToTier min_tokens negative", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.EvictSnapshotToTier(ctx, &pb.EvictSnapshotToTierRequest{MinTokens: -6})
			return err
		}, []string{"min_tokens = -6"}},
		{"PromoteSnapshot new_slot negative", func(ctx context.Context, c pb.NodeCacheClient) error {
			_, err := c.PromoteSnapshot(ctx, &pb.PromoteSnapshotRequest{Key: 1, NewSlot: -7})
			return err
		}, []string{"new_slot = -7"}},
	}
}

// TestInvalidArgument sends every kind of invalid request over real gRPC: each fails with
// InvalidArgument naming the field and value, and none reaches the cache.
func TestInvalidArgument(t *testing.T) {
	n := startNode(t, local.Options{})
	ctx := testCtx(t)
	for _, tc := range invalidCases() {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(ctx, n.client)
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(st.Message(), w) {
					t.Errorf("message %q does not mention %q", st.Message(), w)
				}
			}
		})
	}
	st := must(n.client.Stats(ctx, &pb.StatsRequest{}))(t)
	if st.GetEntries() != 0 || st.GetSnapshotCount() != 0 || st.GetHits()+st.GetMisses() != 0 || st.GetSummarySeq() != 0 {
		t.Fatalf("invalid requests reached the cache: %v", st)
	}
}

// TestLargestRequestFits sends an insert at the size limits (MaxTokens tokens, block ids and disk
// ids, every value a 5-byte varint) and checks it is decoded and judged on its content, not
// refused for its size: MaxMsgSize covers the largest request validation can accept.
func TestLargestRequestFits(t *testing.T) {
	if testing.Short() {
		t.Skip("sends a 15 MiB message")
	}
	n := startNode(t, local.Options{})
	big := make([]uint32, MaxTokens)
	for i := range big {
		big[i] = local.NoBlock - 1
	}
	req := &pb.InsertRequest{Tokens: big, BlockTable: big, DiskBlockIds: big, BlockSize: 1, MatchedTokens: -1}
	if size := proto.Size(req); size > MaxMsgSize || size < MaxMsgSize-(128<<10) {
		t.Fatalf("request of %d bytes: MaxMsgSize %d is not a tight bound", size, MaxMsgSize)
	}
	_, err := n.client.Insert(testCtx(t), req)
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "matched_tokens = -1") {
		t.Fatalf("got %v, want InvalidArgument on matched_tokens (the message must fit)", err)
	}
}

// TestValidateErrors checks the error type contract: every rejection is a *FieldError wrapping
// ErrInvalidArgument, and a valid request passes.
func TestValidateErrors(t *testing.T) {
	err := Validate(&pb.LookupRequest{BlockSize: 0})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "block_size" || !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Validate = %#v, want a FieldError on block_size wrapping ErrInvalidArgument", err)
	}
	if err := Validate(&pb.InsertRequest{Tokens: prompt(1, 9), BlockTable: []uint32{1, 2, 3}, DiskBlockIds: []uint32{4, local.NoBlock, 6}, BlockSize: 4, MatchedTokens: 9}); err != nil {
		t.Fatalf("Validate(valid insert with partial block) = %v", err)
	}
}

// fakeStream is the server side of a GetSummary stream whose request is raw bytes; it discards
// what is sent.
type fakeStream struct {
	grpc.ServerStream
	ctx  context.Context
	data []byte
	sent int
}

func (f *fakeStream) Context() context.Context     { return f.ctx }
func (f *fakeStream) SendMsg(any) error            { f.sent++; return nil }
func (f *fakeStream) RecvMsg(m any) error          { return proto.Unmarshal(f.data, m.(proto.Message)) }
func (f *fakeStream) SetHeader(metadata.MD) error  { return nil }
func (f *fakeStream) SendHeader(metadata.MD) error { return nil }
func (f *fakeStream) SetTrailer(metadata.MD)       {}

// FuzzValidate decodes arbitrary bytes as the request of an arbitrary NodeCache method, as the
// gRPC server would, and hands it to the handler without the recovering interceptor. The
// property: if validation accepts it, handling it does not panic; if validation
// rejects it, the handler answers InvalidArgument. The cache is shared across inputs, so
// sequences of calls build up state.
func FuzzValidate(f *testing.F) {
	srv, err := New(local.NewRadixTree(local.Options{}), Config{NodeID: "fuzz", Epoch: testEpoch})
	if err != nil {
		f.Fatal(err)
	}
	desc := pb.NodeCache_ServiceDesc
	methods := len(desc.Methods) + len(desc.Streams)
	seed := func(method string, req proto.Message) {
		for i, m := range desc.Methods {
			if m.MethodName == method {
				f.Add(uint8(i), must(proto.Marshal(req))(f))
				return
			}
		}
		f.Add(uint8(len(desc.Methods)), must(proto.Marshal(req))(f))
	}
	p := prompt(1, 9)
	seed("Insert", &pb.InsertRequest{Tokens: p, BlockTable: []uint32{1, 2, 3}, BlockSize: 4})
	seed("Insert", &pb.InsertRequest{Tokens: p, BlockTable: []uint32{1, 2, 3}, DiskBlockIds: []uint32{5, 6, 7}, BlockSize: 4, MatchedTokens: 4})
	seed("Insert", &pb.InsertRequest{Tokens: p, BlockTable: []uint32{1, local.NoBlock}, BlockSize: 4})
	seed("InsertWithSnapshot", &pb.InsertWithSnapshotRequest{Tokens: p, BlockTable: []uint32{1, 2}, BlockSize: 4, SnapshotId: 3, SessionHash: 9})
	seed("InsertIntermediateSnapshot", &pb.InsertIntermediateSnapshotRequest{Tokens: p[:4], SnapshotId: 4})
	seed("InsertTailSnapshot", &pb.InsertTailSnapshotRequest{Tokens: p, SnapshotId: 5, SessionHash: 9})
	seed("InsertTailSiblingSnapshot", &pb.InsertTailSiblingSnapshotRequest{Tokens: p[:4], SnapshotId: 6, SessionHash: 9})
	seed("Lookup", &pb.LookupRequest{Tokens: p, BlockSize: 4, SessionHash: 9})
	seed("Lookup", &pb.LookupRequest{Tokens: p, BlockSize: 0})
	seed("PeekMatchedTokens", &pb.PeekMatchedTokensRequest{Tokens: p, BlockSize: 4})
	seed("PinPrefix", &pb.PinPrefixRequest{Tokens: p, BlockSize: 4})
	seed("Release", &pb.ReleaseRequest{Tokens: p, BlockSize: 4})
	seed("ReleaseMatched", &pb.ReleaseMatchedRequest{Tokens: p, BlockSize: 4, MatchedTokens: 8})
	seed("ReleaseMatched", &pb.ReleaseMatchedRequest{Tokens: p, BlockSize: 4, MatchedTokens: 80})
	seed("Evict", &pb.EvictRequest{NumBlocks: 2})
	seed("Evict", &pb.EvictRequest{NumBlocks: -2})
	seed("EvictSnapshotLRU", &pb.EvictSnapshotLRURequest{})
	seed("EvictSnapshotSlot", &pb.EvictSnapshotSlotRequest{Slot: 3})
	seed("EvictSnapshotToTier", &pb.EvictSnapshotToTierRequest{MinTokens: 4})
	seed("PromoteSnapshot", &pb.PromoteSnapshotRequest{Key: 1, NewSlot: 2})
	seed("ForgetSnapshotTierKey", &pb.ForgetSnapshotTierKeyRequest{Key: 1})
	seed("SnapshotCount", &pb.SnapshotCountRequest{})
	seed("Stats", &pb.StatsRequest{})
	seed("IsActive", &pb.IsActiveRequest{})
	seed("GetSummary", &pb.GetSummaryRequest{SinceSeq: proto.Uint64(1)})

	f.Fuzz(func(t *testing.T, method uint8, data []byte) {
		ctx := context.Background()
		i := int(method) % methods
		if i >= len(desc.Methods) {
			st := &fakeStream{ctx: ctx, data: data}
			if err := desc.Streams[i-len(desc.Methods)].Handler(srv, st); err != nil && status.Code(err) != codes.Unknown {
				t.Fatalf("GetSummary: %v", err)
			}
			return
		}
		m := desc.Methods[i]
		var verdict error
		decoded := false
		dec := func(req any) error {
			if err := proto.Unmarshal(data, req.(proto.Message)); err != nil {
				return err
			}
			decoded = true
			verdict = Validate(req)
			return nil
		}
		_, err := m.Handler(srv, ctx, dec, nil)
		if !decoded {
			return
		}
		switch code := status.Code(err); {
		case verdict != nil && code != codes.InvalidArgument:
			t.Fatalf("%s: Validate rejected (%v) but the handler answered %v", m.MethodName, verdict, err)
		case verdict == nil && err != nil:
			t.Fatalf("%s: Validate accepted but the handler failed: %v", m.MethodName, err)
		}
	})
}
