package requests

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/routing"
)

// StackConfig configures a Stack: the request service, its PolicyPicker and passive health.
type StackConfig struct {
	Service Config
	// Policy names the routing policy (routing.PolicyNames); PolicyConfig tunes it.
	Policy       string
	PolicyConfig routing.PolicyConfig
	Picker       PolicyPickerConfig // Ejector is set by NewStack
	Health       HealthConfig
	// Decider, when set, is the decision path shared with the router's gRPC Route and its
	// sharer (Policy, PolicyConfig and Picker.MaxInFlightPerNode are then the decider's); nil
	// builds one over idx with an overlay of its own.
	Decider *routing.Decider
	// WrapPicker, when set, wraps the PolicyPicker before the service uses it (for example
	// router.PinnedPicker, to respect placement pins).
	WrapPicker func(Picker) Picker
	// Flow, when set, is flow control (Deps.Flow).
	Flow flow.Admitter
}

// DefaultStackConfig returns the defaults of each part and the default policy.
func DefaultStackConfig() StackConfig {
	return StackConfig{Service: DefaultConfig(), Policy: routing.PolicyPrefixMesh,
		PolicyConfig: routing.DefaultPolicyConfig(), Health: DefaultHealthConfig()}
}

// Stack is the request service wired to a node source and the summary index: what cmd/router
// serve puts under its doors, built in dependency order (health, picker, service) and stopped in
// reverse. The doors are built over Stack.Service.
type Stack struct {
	Service *Service
	Picker  *PolicyPicker
	Health  *Health
}

// NewStack builds a Stack over nodes and the index the gossip mirror feeds; the service's
// metrics go to reg (nil: none registered). It starts nothing.
func NewStack(cfg StackConfig, nodes NodeSource, idx *routing.Index, reg prometheus.Registerer) (*Stack, error) {
	if nodes == nil || idx == nil {
		return nil, fmt.Errorf("%w: a stack needs a node source and an index", ErrConfig)
	}
	if err := cfg.Service.Validate(); err != nil {
		return nil, err
	}
	probe := &http.Client{Timeout: cfg.Health.ProbeTimeout, Transport: newTransport(&cfg.Service)}
	h, err := NewHealth(cfg.Health, nodes, probe, nil)
	if err != nil {
		return nil, err
	}
	pc := cfg.Picker
	pc.Ejector = h
	var p *PolicyPicker
	if cfg.Decider != nil {
		p, err = NewDeciderPicker(nodes, cfg.Decider, pc)
	} else {
		pol, perr := routing.NewPolicy(cfg.Policy, cfg.PolicyConfig)
		if perr != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, perr)
		}
		p, err = NewPolicyPicker(nodes, idx, routing.NewOverlay(0, 0), pol, pc)
	}
	if err != nil {
		return nil, err
	}
	var pk Picker = p
	if cfg.WrapPicker != nil {
		pk = cfg.WrapPicker(p)
	}
	s, err := New(cfg.Service, Deps{Picker: pk, Health: h, Nodes: nodes, Ejector: h, Flow: cfg.Flow, Registry: reg})
	if err != nil {
		return nil, err
	}
	return &Stack{Service: s, Picker: p, Health: h}, nil
}

// Start starts the health probes and the overlay expiry. It does not block; build the doors over
// Stack.Service to take requests.
func (st *Stack) Start(ctx context.Context) {
	st.Health.Start(ctx)
	st.Picker.Start(ctx)
}

// Close stops the background loops and closes the idle connections to engines; call it once the
// doors have drained.
func (st *Stack) Close() {
	st.Picker.Close()
	st.Health.Close()
	st.Service.Client().CloseIdleConnections()
}
