package router

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// Route refuses a prompt over the prompt token cap with InvalidArgument naming it, whether it
// comes as 4M token ids or as text that tokenises to more (the bytes tokenizer: a token a byte,
// so 2 MiB of text, under MaxTextBytes, is 2Mi tokens).
func TestRoutePromptTokenCap(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	idx.ReplaceNode("a", 1, 1, nil)
	cfg := DefaultConfig()
	tok, err := tokenizer.New(tokenizer.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tokenizer = tok
	srv, err := NewServer(NewView(fakeMirror{node("a", 16, true, 0)}, idx), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]*pb.RouteRequest{
		"ids":  {Tokens: make([]uint32, 4_000_000)},
		"text": {Text: strings.Repeat("a", 2<<20)},
	} {
		_, err := srv.Route(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), strconv.Itoa(requests.MaxPromptTokens)) {
			t.Fatalf("%s over the cap: %v, want InvalidArgument naming %d", name, err, requests.MaxPromptTokens)
		}
	}
	if _, err := srv.Route(context.Background(), &pb.RouteRequest{Text: strings.Repeat("a", 1000)}); err != nil {
		t.Fatalf("a short text: %v", err)
	}
}
