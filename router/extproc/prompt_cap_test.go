package extproc

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// A 4M-token prompt is answered at once with 413 naming the prompt token cap, the way the picker
// answers other bad requests, rather than parsed in full and routed.
func TestPromptTokenCap(t *testing.T) {
	r := newRig(t, rigOpts{noEngines: true})
	const n = 4_000_000
	body := make([]byte, 0, 2*n+64)
	body = append(body, `{"model":"`+simModel+`","max_tokens":1,"prompt":[`...)
	body = append(body, bytes.Repeat([]byte("1,"), n-1)...)
	body = append(body, "1]}"...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st := rawStream(t, ctx, r, "/v1/completions", false)
	if err := sendBody(st, body, true); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	ir := m.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("answered %T, want an immediate 413", m.GetResponse())
	}
	if got := ir.GetStatus().GetCode(); got != typev3.StatusCode_PayloadTooLarge || !strings.Contains(string(ir.GetBody()), strconv.Itoa(1<<20)) {
		t.Fatalf("immediate %v %s, want 413 naming the cap of %d tokens", got, ir.GetBody(), 1<<20)
	}
}
