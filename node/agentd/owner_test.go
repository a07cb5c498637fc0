package agentd

import (
	"context"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestReadOnlyNamesTheOwner: a NodeCache write refused by a mirroring agent says the cache is
// the mirrored engine's, not an in-process engine's; the simulated engine's agent says that one.
func TestReadOnlyNamesTheOwner(t *testing.T) {
	for engine, want := range map[string]string{
		engineVLLM:   "owned by the vllm engine beside this agent",
		engineSGLang: "owned by the sglang engine beside this agent",
		engineSim:    "owned by the in-process simulated engine (--engine=sim)",
	} {
		srv, err := node.New(local.NewRadixTree(local.Options{}), node.Config{NodeID: "n", BlockSize: 16, ReadOnly: true, Owner: cacheOwner(engine)})
		if err != nil {
			t.Fatal(err)
		}
		_, err = srv.Lookup(context.Background(), &pb.LookupRequest{Tokens: make([]uint32, 32), BlockSize: 16})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--engine=%s: Lookup error %v, want it to say %q", engine, err, want)
		}
	}
}
