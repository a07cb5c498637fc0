package requests

import (
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// deadlinePolicy is the policy configuration ExpectedTTFT predicts with: the routing policy's
// defaults, so a door's deadlines and the routing decision assume the same nominal speed.
var deadlinePolicy = routing.DefaultPolicyConfig()

// ExpectedTTFT is how long node n should take to its first token for a request with prefill
// uncached prompt tokens: routing.PredictTTFT, by what the router has learned of the node (its
// queued prefill ahead, the request's own, its learned rate, overhead and decode load), the
// prefixmesh policy's cost without the miss penalty (routing/POLICIES.md). PolicyPicker sets
// Pick.ExpectedTTFT with it (the front door's first-byte deadline scales with it); gRPC Route
// traces it.
func ExpectedTTFT(n *routing.NodeInfo, prefill int) time.Duration {
	return routing.PredictTTFTDuration(n, prefill, &deadlinePolicy)
}
