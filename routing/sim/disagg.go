package sim

import "github.com/prefixmesh/prefixmesh/routing"

// Disagg is when a disaggregated fleet's router sends a request's prefill to a prefill node
// (Config.Disaggregate): the router's own rule in one of its modes, or a baseline's rule.
type Disagg string

const (
	// DisaggAuto: routing.Decider.PlanPrefill, auto: remote when its predicted first token is
	// sooner (routing/POLICIES.md, "Disaggregation").
	DisaggAuto Disagg = "auto"
	// DisaggAlways: remote whenever the decode node lacks more than a block.
	DisaggAlways Disagg = "always"
	// DisaggNever: every prefill on the decode node (the prefill nodes idle).
	DisaggNever Disagg = "never"
	// DisaggLLMD: llm-d's prefix-based P/D decider (routing.PlanPrefillLLMD) with
	// Config.LLMDNonCachedTokens.
	DisaggLLMD Disagg = "llmd"
	// DisaggDynamo: Dynamo's conditional disaggregation, isl_bounding
	// (routing.PlanPrefillDynamo).
	DisaggDynamo Disagg = "dynamo"
)

// DisaggModes lists the modes in the order `router sim` shows them.
func DisaggModes() []Disagg {
	return []Disagg{DisaggAuto, DisaggLLMD, DisaggDynamo, DisaggAlways, DisaggNever}
}

func (d Disagg) valid() bool {
	switch d {
	case DisaggAuto, DisaggAlways, DisaggNever, DisaggLLMD, DisaggDynamo:
		return true
	}
	return false
}

// mode is the router's own mode for auto, always and never.
func (d Disagg) mode() routing.DisaggMode {
	switch d {
	case DisaggAlways:
		return routing.DisaggAlways
	case DisaggNever:
		return routing.DisaggNever
	}
	return routing.DisaggAuto
}
