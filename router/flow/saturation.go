package flow

import (
	"fmt"
	"math"
	"time"
)

// NodeLoad is what saturation reads of one node: its last load report, its age, and this
// router's requests in flight to it.
type NodeLoad struct {
	Waiting, Running           int // reported
	FreeBlocks, CapacityBlocks int // reported; CapacityBlocks 0: unknown (the KV term is left out)
	LoadAge                    time.Duration
	InFlight                   int // this router's (and its peers', as shared) requests not yet completed
}

// Thresholds say when a node is saturated.
type Thresholds struct {
	// QueueDepth is the waiting requests at which a node is saturated. Default 5, llm-d's:
	// an engine with a few requests waiting is already batching at its limit, and a queue at
	// the router can be reordered by priority and tenant where the engine's cannot.
	QueueDepth float64
	// KVUtil is the KV-cache utilisation at which a node is saturated. Default 0.8, llm-d's:
	// beyond it an engine starts preempting (recomputing) running sequences.
	KVUtil float64
	// StaleAfter is the age beyond which a node's load report is not trusted and the node
	// counts as saturated (fail-closed). Default 1 s: nodes report every 200 ms at most, so
	// five reports in a row were lost or the node is stuck.
	StaleAfter time.Duration
}

// DefaultThresholds returns the defaults documented on Thresholds.
func DefaultThresholds() Thresholds {
	return Thresholds{QueueDepth: 5, KVUtil: 0.8, StaleAfter: time.Second}
}

// Validate reports a threshold that cannot work.
func (th *Thresholds) Validate() error {
	if !(th.QueueDepth > 0) || !(th.KVUtil > 0 && th.KVUtil <= 1) || th.StaleAfter <= 0 {
		return fmt.Errorf("flow: thresholds: queue depth %v must be > 0, KV utilisation %v in (0, 1], stale-after %v > 0",
			th.QueueDepth, th.KVUtil, th.StaleAfter)
	}
	return nil
}

// Score is a node's saturation, 1 or more when saturated: max(waiting/QueueDepth,
// kvUtil/KVUtil), and 1 for a stale report. Waiting is the larger of the reported queue and
// this router's requests in flight beyond what the node reported running: the report is up to
// a load interval old, the in-flight count is current, and a request the router sent that the
// node does not run yet is waiting (or on its way).
func (th *Thresholds) Score(n *NodeLoad) float64 {
	if n.LoadAge > th.StaleAfter {
		return 1
	}
	w := max(n.Waiting, n.InFlight-n.Running)
	s := float64(w) / th.QueueDepth
	if n.CapacityBlocks > 0 {
		used := float64(n.CapacityBlocks-min(n.FreeBlocks, n.CapacityBlocks)) / float64(n.CapacityBlocks)
		s = max(s, used/th.KVUtil)
	}
	return s
}

// Headroom is the mean score over nodes and the requests that may pass before it reaches 1:
// each request adds one waiting request to one node, so at most 1/(len(nodes) × QueueDepth) to
// the mean, and ceil((1 − mean) × len(nodes) × QueueDepth) requests overshoot by less than
// one. No nodes: mean +Inf, headroom 0.
func (th *Thresholds) Headroom(nodes []NodeLoad) (mean float64, headroom int) {
	if len(nodes) == 0 {
		return math.Inf(1), 0
	}
	sum := 0.0
	for i := range nodes {
		sum += th.Score(&nodes[i])
	}
	mean = sum / float64(len(nodes))
	if mean >= 1 {
		return mean, 0
	}
	// Less a rounding error, so that an exact whole number of requests is not rounded up.
	h := math.Ceil((1-mean)*float64(len(nodes))*th.QueueDepth - 1e-9)
	return mean, int(min(h, math.MaxInt32))
}
