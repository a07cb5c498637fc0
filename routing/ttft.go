package routing

import (
	"math"
	"time"
)

// TTFTFit is what a router has learned of one node's time to first token from the requests it
// sent there (routing/POLICIES.md, "Learning each node's TTFT"): a request that finds work
// prefill tokens ahead of and including its own uncached ones, and seqs sequences on the node,
// reaches its first token after
//
//	TTFT = Overhead + Scale × work / nominal rate + PerSeq × seqs / TTFTSeqUnit
//
// seconds, where the nominal rate is the node's reported prefill rate (else the policy's
// default). Scale is how much slower than nominal the node prefills (2 = half the rate), Overhead
// what every request waits beyond its prefill (the network, the engine's own scheduling), PerSeq
// what each unit of running sequences adds (decode sharing the engine's steps, admission behind a
// full batch). The zero value is the prior: Scale 1, nothing else, which is the cost prefixmesh
// uses before it has observed a node.
type TTFTFit struct {
	Overhead float64 // seconds
	Scale    float64 // multiplier on the nominal prefill time; 0 means 1 (not learned)
	PerSeq   float64 // seconds per TTFTSeqUnit running sequences
	Samples  float64 // effective (forgotten) observations behind the fit
	// FleetScale is the fleet's Scale (every node's observations together), which weighs
	// prefixmesh's miss penalty: a node's own Scale, noisier, moves only its TTFT.
	FleetScale float64
}

// TTFTSeqUnit is the number of sequences one unit of the fit's PerSeq feature stands for: a
// scale at which a busy node's feature is of order 1, like the prefill feature's seconds.
const TTFTSeqUnit = 32

// The learner's constants. A router learns twice from every first token: a fleet fit (all nodes'
// observations, prior weight ttftPrior at feature scale 1, so a handful of samples cannot swing
// it) and the node's own fit, shrunk toward the fleet's with weight ttftNodePrior: a node's
// features are biased in its own way (a node whose queue holds requests sharing a prefix, or
// whose current prefill is half done, has less work ahead than the router counts), and a node fit
// free to follow that bias makes its node look faster and draws traffic that breaks cache
// locality; the shrinkage keeps such noise small while a node that is truly twice as slow still
// stands out. The fleet fit forgets after about ttftFleetMemory observations, a node's after
// ttftNodeMemory of its own (so its data outweighs the prior 4 to 1 once it has them, and a node
// that slows down shows within a few hundred of its requests). The node memory and prior were
// chosen on the Mooncake trace, as recorded and with every fourth node at half speed, among
// (128, 64), (128, 256), (1024, 256), (1024, 1024) and (4096, 1024) (routing/POLICIES.md,
// "Learning each node's TTFT"); the clamps keep a pathological fit (errors answered fast, a
// clock step) from making a node look free or unusable.
const (
	ttftFleetMemory = 128
	ttftPrior       = 2.0
	ttftNodeMemory  = 1024
	ttftNodePrior   = 256.0
	ttftMinScale    = 1.0 / 16
	ttftMaxScale    = 16.0
	ttftMaxSec      = 60.0
)

// ttftDistinct is how far (as a ratio) a node's own fit must stand from the fleet's, in the TTFT
// both predict for the node's typical request (its mean features), before the router uses it:
// within it the node gets the fleet fit. The shrinkage alone left homogeneous nodes' fits up to
// ~20% apart by their features' own biases, enough to draw traffic from cache locality (64 nodes
// of the Mooncake trace: 0.669 s mean TTFT against 0.630 s without learning); a node truly twice
// as slow stands out by more. Chosen on the Mooncake trace (8 and 64 nodes, and with half-speed
// nodes) among 0, 0.25 and 0.5 (routing/POLICIES.md, "Learning each node's TTFT").
const ttftDistinct = 0.25

// distinctFrom reports whether the learner's fit predicts its node's typical request further
// than ttftDistinct from what the fleet fit predicts for it.
func (l *ttftLearner) distinctFrom(fleet TTFTFit) bool {
	if !(l.xx[0][0] > 0) {
		return false
	}
	work, seqs := l.xx[0][1]/l.xx[0][0], l.xx[0][2]/l.xx[0][0]
	own := l.fit.Overhead + l.fit.PrefillScale()*work + l.fit.PerSeq*seqs
	all := fleet.Overhead + fleet.PrefillScale()*work + fleet.PerSeq*seqs
	if !(all > 0) {
		return own > 0
	}
	r := own / all
	return r > 1+ttftDistinct || r < 1/(1+ttftDistinct)
}

// PrefillScale is the fit's prefill multiplier: Scale, or 1 when not learned.
func (f TTFTFit) PrefillScale() float64 { return orOne(f.Scale) }

// fleetScale is the fleet's multiplier the fit carries (FleetScale, or 1 when not learned).
func (f TTFTFit) fleetScale() float64 { return orOne(f.FleetScale) }

// orOne is v when it is a learned (positive) multiplier, else the prior's 1.
func orOne(v float64) float64 {
	if v > 0 {
		return v
	}
	return 1
}

// ttftLearner is the weighted ridge regression behind a TTFTFit: exponentially forgotten sums of
// x xᵀ and x y over the features x = (1, nominal prefill seconds, sequences / TTFTSeqUnit),
// solved toward a prior fit after every observation (a 3×3 system).
type ttftLearner struct {
	xx  [3][3]float64
	xy  [3]float64
	n   float64
	fit TTFTFit
}

// observe adds one request's features and observed TTFT (seconds) and refits toward prior with
// the given weight.
func (l *ttftLearner) observe(work, seqs, ttft float64, prior TTFTFit, strength, memory float64) {
	if !plausibleTTFT(work, seqs, ttft) {
		return // a clock step or garbage: never learn from it
	}
	keep := 1 - 1/memory
	x := [3]float64{1, work, seqs}
	for i := range x {
		for j := range x {
			l.xx[i][j] = keep*l.xx[i][j] + x[i]*x[j]
		}
		l.xy[i] = keep*l.xy[i] + x[i]*ttft
	}
	l.n = keep*l.n + 1
	var m [3][3]float64
	var r [3]float64
	p := [3]float64{prior.Overhead, prior.PrefillScale(), prior.PerSeq}
	for i := range m {
		m[i] = l.xx[i]
		m[i][i] += strength
		r[i] = l.xy[i] + strength*p[i]
	}
	th, ok := solve3(m, r)
	if !ok {
		return
	}
	l.fit = TTFTFit{
		Overhead: clamp(th[0], 0, ttftMaxSec),
		Scale:    clamp(th[1], ttftMinScale, ttftMaxScale),
		PerSeq:   clamp(th[2], 0, ttftMaxSec),
		Samples:  l.n,
	}
}

// plausibleTTFT reports whether an observation may be learned: no negative or NaN figure, and a
// time to first token of at most ttftMaxSec.
func plausibleTTFT(work, seqs, ttft float64) bool {
	return ttft >= 0 && ttft <= ttftMaxSec && work >= 0 && seqs >= 0
}

func clamp(v, lo, hi float64) float64 { return math.Min(math.Max(v, lo), hi) }

// solve3 solves m θ = r by Gaussian elimination with partial pivoting; ok is false when m is
// singular (it never is with the ridge prior, but the arithmetic is checked anyway).
func solve3(m [3][3]float64, r [3]float64) (th [3]float64, ok bool) {
	for c := 0; c < 3; c++ {
		p := c
		for i := c + 1; i < 3; i++ {
			if math.Abs(m[i][c]) > math.Abs(m[p][c]) {
				p = i
			}
		}
		if !(math.Abs(m[p][c]) > 1e-12) {
			return th, false
		}
		m[c], m[p] = m[p], m[c]
		r[c], r[p] = r[p], r[c]
		for i := c + 1; i < 3; i++ {
			f := m[i][c] / m[c][c]
			for j := c; j < 3; j++ {
				m[i][j] -= f * m[c][j]
			}
			r[i] -= f * r[c]
		}
	}
	for i := 2; i >= 0; i-- {
		s := r[i]
		for j := i + 1; j < 3; j++ {
			s -= m[i][j] * th[j]
		}
		th[i] = s / m[i][i]
	}
	for _, v := range th {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return th, false
		}
	}
	return th, true
}

// nominalRate is the node's prefill rate before learning: its report, else the default.
func nominalRate(n *NodeInfo, cfg *PolicyConfig) float64 {
	if n.PrefillTokensPerSec > 0 {
		return n.PrefillTokensPerSec
	}
	return cfg.DefaultPrefillTokensPerSec
}

// prefillAhead is the uncached prefill work, in tokens, queued on n ahead of a request sent now:
// the larger of the node's report, drained at its (learned) rate over the report's age, and the
// router's own fresh count of prefill tokens it sent there and not yet answered.
func prefillAhead(n *NodeInfo, cfg *PolicyConfig) float64 {
	rate := nominalRate(n, cfg) / n.TTFT.PrefillScale()
	queued := float64(n.QueuedPrefillTokens) - rate*n.LoadAge.Seconds()
	return max(queued, float64(n.InFlightPrefillTokens), 0) // the builtin: math.Max's NaN and signed-zero rules, inlined
}

// seqsOn is the number of sequences on n as best known: the node's report or the router's count
// of requests in flight there, whichever is larger.
func seqsOn(n *NodeInfo) int { return max(n.Running, n.InFlight) }

// ttftFeatures are the learner's features for a request with uncached prompt tokens on n.
func ttftFeatures(n *NodeInfo, uncached int, cfg *PolicyConfig) (work, seqs float64) {
	work = (prefillAhead(n, cfg) + float64(max(uncached, 0))) / nominalRate(n, cfg)
	return work, float64(seqsOn(n)) / TTFTSeqUnit
}

// PredictTTFT is the time to first token, in seconds, of a request with uncached prompt tokens
// sent to n now, by n's learned fit (NodeInfo.TTFT; the prior when nothing is learned). It is
// prefixmesh's cost without the miss penalty, and the front door's expectation of a first byte.
func PredictTTFT(n *NodeInfo, uncached int, cfg *PolicyConfig) float64 {
	work, seqs := ttftFeatures(n, uncached, cfg)
	f := n.TTFT
	return f.Overhead + f.PrefillScale()*work + f.PerSeq*seqs
}

// PredictTTFTDuration is PredictTTFT as a duration, at most an hour.
func PredictTTFTDuration(n *NodeInfo, uncached int, cfg *PolicyConfig) time.Duration {
	sec := PredictTTFT(n, uncached, cfg)
	if !(sec < float64(time.Hour/time.Second)) {
		return time.Hour
	}
	return time.Duration(sec * float64(time.Second))
}
