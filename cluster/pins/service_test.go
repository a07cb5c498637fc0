package pins

import (
	"context"
	"net"
	"testing"
	"time"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// newSoloService runs a one-voter store with its gRPC service and returns a client.
func newSoloService(t *testing.T) (pb.PinsClient, *Store) {
	t.Helper()
	cfg := testConfig("solo", t.TempDir(), "127.0.0.1:0")
	cfg.Bootstrap = true
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	NewService(s, nil).Register(gs)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		gs.Stop()
		<-done
		_ = s.Shutdown(context.Background())
	})
	waitFor(t, 10*time.Second, "leader", s.IsLeader)
	return pb.NewPinsClient(cc), s
}

func TestServiceErrorsAndWatch(t *testing.T) {
	c, _ := newSoloService(t)
	ctx := ctxT(t, 20*time.Second)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w, err := c.Watch(wctx, &pb.WatchPinsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Recv()
	if err != nil || !first.GetReset_() || len(first.GetState().GetAdapters()) != 0 {
		t.Fatalf("first watch event %v: %v", first, err)
	}

	put, err := c.PutAdapter(ctx, &pb.PutAdapterRequest{Adapter: &pb.Adapter{Id: 3, Name: "chat"}})
	if err != nil {
		t.Fatal(err)
	}
	v := put.GetAdapter().GetVersion()
	stale := v + 100
	_, err = c.PutAdapter(ctx, &pb.PutAdapterRequest{Adapter: &pb.Adapter{Id: 3, Name: "chat2"}, ExpectedVersion: &stale})
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("stale CAS: %v", err)
	}
	var current string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			current = info.GetMetadata()["current_version"]
		}
	}
	if want := status.Convert(err).Message(); current == "" {
		t.Fatalf("no current_version detail in %q", want)
	}
	for _, tc := range []struct {
		call func() error
		code codes.Code
	}{
		{func() error { _, err := c.PutAdapter(ctx, &pb.PutAdapterRequest{}); return err }, codes.InvalidArgument},
		{func() error {
			_, err := c.PinAdapter(ctx, &pb.PinAdapterRequest{AdapterId: 3, Nodes: []string{"a\x00"}})
			return err
		}, codes.InvalidArgument},
		{func() error {
			_, err := c.PinAdapter(ctx, &pb.PinAdapterRequest{AdapterId: 4, Nodes: []string{"a"}})
			return err
		}, codes.NotFound},
		{func() error {
			_, err := c.PinPrefix(ctx, &pb.SetPrefixPinRequest{AdapterId: 3, Text: "hello", Nodes: []string{"a"}})
			return err
		}, codes.InvalidArgument}, // no tokenizer configured
		{func() error { _, err := c.UnpinPrefix(ctx, &pb.ClearPrefixPinRequest{AdapterId: 3}); return err }, codes.InvalidArgument},
	} {
		if got := status.Code(tc.call()); got != tc.code {
			t.Errorf("got %v, want %v", got, tc.code)
		}
	}
	if _, err := c.PinAdapter(ctx, &pb.PinAdapterRequest{AdapterId: 3, Nodes: []string{"b", "a"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PinPrefix(ctx, &pb.SetPrefixPinRequest{AdapterId: 3, Tokens: []uint32{9, 8}, Nodes: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteAdapter(ctx, &pb.DeleteAdapterRequest{Id: 3}); err != nil {
		t.Fatal(err)
	}
	var kinds []pb.PinChange_Kind
	for len(kinds) < 6 {
		ev, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range ev.GetChanges() {
			kinds = append(kinds, ch.GetKind())
		}
	}
	want := []pb.PinChange_Kind{pb.PinChange_PUT_ADAPTER, pb.PinChange_PIN_ADAPTER, pb.PinChange_PIN_PREFIX,
		pb.PinChange_UNPIN_ADAPTER, pb.PinChange_UNPIN_PREFIX, pb.PinChange_DELETE_ADAPTER}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("watch changes %v, want %v", kinds, want)
		}
	}
	l, err := c.List(ctx, &pb.ListPinsRequest{Linearizable: true})
	if err != nil || len(l.GetAdapters()) != 0 || l.GetServerId() != "solo" || l.GetLeaderId() != "solo" {
		t.Fatalf("list: %v %v", l, err)
	}
}
