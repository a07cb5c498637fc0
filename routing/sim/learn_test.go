package sim

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// The routers are never told the nodes' speeds: with every fourth node at half speed, prefixmesh
// learns them from first tokens, and its mean TTFT beats (its p99 is no worse than) the same run
// without learning, which treats every node as nominal. The comparison is between two runs of the simulator, not against
// a number the learner produced.
func TestRoutersLearnSlowNodes(t *testing.T) {
	tr := uniqueTrace(t, 2000, 150*time.Millisecond)
	cfg := smallConfig()
	cfg.BlocksPerNode = 8192
	cfg.NodeSpeeds = []float64{1, 1, 1, 0.5}
	learned, s := run(t, tr, "prefixmesh", cfg)
	cfg.NoTTFTLearning = true
	blind, _ := run(t, tr, "prefixmesh", cfg)
	t.Logf("mean TTFT learned %.3f s (p99 %.2f), blind %.3f s (p99 %.2f)", learned.TTFTMean, learned.TTFTP99, blind.TTFTMean, blind.TTFTP99)
	fast, slow := s.routers[0].dec.LearnedTTFT(s.nodes[0].id), s.routers[0].dec.LearnedTTFT(s.nodes[3].id)
	t.Logf("fast %+v slow %+v", fast, slow)
	if !(learned.TTFTMean < blind.TTFTMean) || learned.TTFTP99 > blind.TTFTP99 {
		t.Fatalf("learning did not help: mean TTFT %.3f s against %.3f s without", learned.TTFTMean, blind.TTFTMean)
	}
	ps := routing.PredictTTFT(&routing.NodeInfo{TTFT: slow}, 2048, &cfg.Policy)
	pf := routing.PredictTTFT(&routing.NodeInfo{TTFT: fast}, 2048, &cfg.Policy)
	if !(ps > pf) {
		t.Fatalf("the half-speed node looks no slower: predicted %.3f s against %.3f s (%+v, %+v)", ps, pf, slow, fast)
	}
}

// uniqueTrace is n requests, spacing apart, of 4–8 blocks no other request shares: every prompt
// is prefilled whole, so each node's speed shows in every first token.
func uniqueTrace(t *testing.T, n int, spacing time.Duration) *Trace {
	t.Helper()
	var b strings.Builder
	next := 0
	for i := 0; i < n; i++ {
		var ids []string
		for k := 0; k < 4+i%5; k++ {
			next++
			ids = append(ids, fmt.Sprint(next))
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 20, "hash_ids": [%s]}`+"\n",
			int64(i)*spacing.Milliseconds(), len(ids)*MooncakeBlockTokens, strings.Join(ids, ", "))
	}
	tr, err := ReadMooncake(strings.NewReader(b.String()), ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}
