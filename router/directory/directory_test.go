package directory

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/routing"
)

// fixture: a 6-block prompt (block size 4, 26 tokens: two tokens past the last full block) held
// as follows, written out by hand:
//
//	node a (model m): GPU blocks 0–3
//	node b (model m): GPU block 0, CPU blocks 0–5, disk blocks 0–1
//	node c (model m): disk blocks 0–2 (nothing on the GPU)
//	node d (model other): GPU blocks 0–5
//	node e (model m, block size 16): nothing
func fixture(t testing.TB) (*Directory, []uint32) {
	t.Helper()
	tokens := make([]uint32, 26)
	for i := range tokens {
		tokens[i] = uint32(100 + i)
	}
	h := local.AppendBlockHashes(nil, tokens, 4, 0)
	if len(h) != 6 {
		t.Fatalf("%d hashes", len(h))
	}
	tier := func(t local.Tier, hs []uint64) []uint64 {
		var out []uint64
		for _, x := range hs {
			out = append(out, local.TierKey(x, t))
		}
		return out
	}
	x := routing.NewIndex(routing.DefaultIndexConfig())
	x.ReplaceNode("a", 1, 1, h[:4])
	x.ReplaceNode("b", 1, 1, append(append(append([]uint64{}, h[:1]...), tier(local.TierCPU, h)...), tier(local.TierDisk, h[:2])...))
	x.ReplaceNode("c", 1, 1, tier(local.TierDisk, h[:3]))
	x.ReplaceNode("d", 1, 1, h)
	x.ReplaceNode("e", 1, 1, nil)
	nodes := []Node{{"a", "m", 4}, {"b", "m", 4}, {"c", "m", 4}, {"d", "other", 4}, {"e", "m", 16}}
	return New(x, func(dst []Node) []Node { return append(dst, nodes...) }), tokens
}

func TestLookup(t *testing.T) {
	d, tokens := fixture(t)
	var sc Scratch
	got, err := d.Lookup(&Query{Model: "m", BlockSize: 4, Tokens: tokens}, &sc)
	if err != nil {
		t.Fatal(err)
	}
	const gpu, cpu, disk = local.TierGPU, local.TierCPU, local.TierDisk
	want := []Match{
		{Node: "a", Longest: 16, Prefix: routing.TierTokens{gpu: 16}},
		// b: GPU block 0, then blocks 1–5 from the CPU (block 1 is on disk too: counted once).
		{Node: "b", Longest: 24, Prefix: routing.TierTokens{gpu: 4, cpu: 24, disk: 8}},
		{Node: "c", Longest: 12, Prefix: routing.TierTokens{disk: 12}},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v (only model m at block size 4)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("node %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// By hash, one instance: the same answer as by tokens.
	h := local.AppendBlockHashes(nil, tokens, 4, 0)
	got, err = d.Lookup(&Query{Model: "m", BlockSize: 4, Hashes: h, Instance: "b"}, &sc)
	if err != nil || len(got) != 1 || got[0] != want[1] {
		t.Fatalf("by hash, instance b: %+v %v", got, err)
	}
	// Another adapter's prompt hashes differently: no match anywhere.
	got, _ = d.Lookup(&Query{Model: "m", BlockSize: 4, Tokens: tokens, LoRA: "7"}, &sc)
	for _, m := range got {
		if m.Longest != 0 || m.Prefix != (routing.TierTokens{}) {
			t.Fatalf("adapter 7 matched %+v", m)
		}
	}
}

func TestAllocsLookup(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	d, tokens := fixture(t)
	var sc Scratch
	q := &Query{Model: "m", BlockSize: 4, Tokens: tokens}
	if n := testing.AllocsPerRun(100, func() { _, _ = d.Lookup(q, &sc) }); n != 0 {
		t.Fatalf("Lookup allocated %.1f times", n)
	}
}

func post(t *testing.T, srv *httptest.Server, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The HTTP answers in Mooncake Conductor's shape; the expected bytes are written from the
// fixture's layout and that API's example ({"default": {"instance": {"longest_matched", "GPU",
// "CPU", "DISK"}}}).
func TestHTTPQuery(t *testing.T) {
	d, tokens := fixture(t)
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	ids, _ := json.Marshal(tokens)
	code, body := post(t, srv, "/query", `{"model":"m","token_ids":`+string(ids)+`,"block_size":4,"tenant_id":"t1"}`)
	want := `{"t1":{` +
		`"a":{"longest_matched":16,"GPU":16,"CPU":0,"DISK":0,"STORAGE":0,"REMOTE":0},` +
		`"b":{"longest_matched":24,"GPU":4,"CPU":24,"DISK":8,"STORAGE":0,"REMOTE":0},` +
		`"c":{"longest_matched":12,"GPU":0,"CPU":0,"DISK":12,"STORAGE":0,"REMOTE":0}}}` + "\n"
	if code != 200 || body != want {
		t.Fatalf("%d %s\nwant %s", code, body, want)
	}
	h := local.AppendBlockHashes(nil, tokens, 4, 0)
	hs, _ := json.Marshal(h)
	code, body = post(t, srv, "/query_by_hash", `{"model":"m","block_hash":`+string(hs)+`,"block_size":4,"instance_id":"c"}`)
	if want := `{"default":{"c":{"longest_matched":12,"GPU":0,"CPU":0,"DISK":12,"STORAGE":0,"REMOTE":0}}}` + "\n"; code != 200 || body != want {
		t.Fatalf("by hash: %d %s", code, body)
	}
	code, body = post(t, srv, "/query", `{"model":"m","token_ids":`+string(ids)+`,"block_size":4,"cache_salt":"s","instance_id":"a"}`)
	if want := `{"default":{"a":{"longest_matched":0,"GPU":0,"CPU":0,"DISK":0,"STORAGE":0,"REMOTE":0}}}` + "\n"; code != 200 || body != want {
		t.Fatalf("salted: %d %s", code, body)
	}
}

// Bad queries get a 4xx with an OpenAI-shaped body naming the field.
func TestHTTPBadQueries(t *testing.T) {
	d, _ := fixture(t)
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	huge := "[" + strings.Repeat("1,", 1<<20) + "1]" // one id over the prompt cap
	for _, c := range []struct {
		path, body string
		code       int
		param      string
	}{
		{"/query", `{"token_ids":[1],"block_size":4}`, 400, "model"},
		{"/query", `{"model":"m","token_ids":[1]}`, 400, "block_size"},
		{"/query", `{"model":"m","block_size":4}`, 400, "token_ids"},
		{"/query", `{"model":"m","token_ids":[1],"seq_hashes":[1],"block_size":4}`, 400, "seq_hashes"},
		{"/query", `{"model":"m","token_ids":[-1],"block_size":4}`, 400, ""},
		{"/query", `{"model":"m","token_ids":[1],"block_size":4,"extra":1}`, 400, ""},
		{"/query", `{"model":"m","token_ids":[1],"block_size":4} {}`, 400, ""},
		{"/query", `{"model":"m","token_ids":[1],"block_size":4,"lora_name":"x","lora_id":3}`, 400, "lora_id"},
		{"/query", `{"model":"m","token_ids":` + huge + `,"block_size":4}`, 413, "token_ids"},
		{"/query_by_hash", `{"model":"m","block_size":4}`, 400, "seq_hashes"},
		{"/query_by_hash", `{"model":"m","token_ids":[1],"block_size":4}`, 400, "token_ids"},
		{"/query_by_hash", strings.Repeat(" ", MaxQueryBytes+1), 413, ""},
	} {
		code, body := post(t, srv, c.path, c.body)
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Param   *string `json:"param"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || code != c.code || e.Error.Message == "" {
			t.Errorf("%s %.60s: %d %s, want %d", c.path, c.body, code, body, c.code)
			continue
		}
		if got := ""; e.Error.Param != nil {
			got = *e.Error.Param
			if got != c.param {
				t.Errorf("%.60s: param %q, want %q", c.body, got, c.param)
			}
		} else if c.param != "" {
			t.Errorf("%.60s: no param, want %q", c.body, c.param)
		}
	}
	resp, err := http.Get(srv.URL + "/query")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /query: %d", resp.StatusCode)
	}
}

// The gRPC codec answers as the lookup does, over a real gRPC connection on loopback, and refuses
// bad queries with InvalidArgument naming the field.
func TestGRPCQuery(t *testing.T) {
	d, tokens := fixture(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterDirectoryServer(srv, NewGRPC(d))
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewDirectoryClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Query(ctx, &pb.DirectoryQueryRequest{Model: "m", Tokens: tokens, BlockSize: 4, InstanceId: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Matches) != 1 {
		t.Fatalf("%v", resp)
	}
	m := resp.Matches[0]
	if m.Node != "b" || m.LongestMatched != 24 || m.Gpu != 4 || m.Cpu != 24 || m.Disk != 8 || m.Storage != 0 || m.Remote != 0 {
		t.Fatalf("b: %v, want longest 24, GPU 4, CPU 24, disk 8", m)
	}
	for _, bad := range []*pb.DirectoryQueryRequest{
		{Tokens: tokens, BlockSize: 4},
		{Model: "m", Tokens: tokens},
		{Model: "m", BlockSize: 4},
		{Model: "m", BlockSize: 4, Tokens: tokens, BlockHashes: []uint64{1}},
	} {
		_, err := c.Query(ctx, bad)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", bad, err)
		}
	}
}
