package frontdoor

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/routing"
)

// StackConfig configures a Stack: the front door, its PolicyPicker and passive health.
type StackConfig struct {
	Server Config
	// Policy names the routing policy (routing.PolicyNames); PolicyConfig tunes it.
	Policy       string
	PolicyConfig routing.PolicyConfig
	Picker       PolicyPickerConfig // Ejector is set by NewStack
	Health       HealthConfig
	// Decider, when set, is the decision path shared with the router's gRPC Route and its
	// sharer (Policy, PolicyConfig and Picker.MaxInFlightPerNode are then the decider's); nil
	// builds one over idx with an overlay of its own.
	Decider *routing.Decider
	// WrapPicker, when set, wraps the PolicyPicker before the server uses it (for example
	// router.PinnedPicker, to respect placement pins).
	WrapPicker func(Picker) Picker
	// Flow, when set, is flow control (Deps.Flow).
	Flow flow.Admitter
}

// DefaultStackConfig returns the defaults of each part and the default policy.
func DefaultStackConfig() StackConfig {
	return StackConfig{Server: DefaultConfig(), Policy: routing.PolicyPrefixMesh,
		PolicyConfig: routing.DefaultPolicyConfig(), Health: DefaultHealthConfig()}
}

// Stack is the front door wired to a node source and the summary index: what cmd/router serve
// needs, built in dependency order (health, picker, server) and stopped in reverse.
type Stack struct {
	Server *Server
	Picker *PolicyPicker
	Health *Health
}

// NewStack builds a Stack over nodes and the index the gossip mirror feeds. It starts nothing.
func NewStack(cfg StackConfig, nodes NodeSource, idx *routing.Index, reg *prometheus.Registry, logger *slog.Logger) (*Stack, error) {
	if nodes == nil || idx == nil {
		return nil, fmt.Errorf("%w: a stack needs a node source and an index", ErrConfig)
	}
	if err := cfg.Server.Validate(); err != nil {
		return nil, err
	}
	probe := &http.Client{Timeout: cfg.Health.ProbeTimeout, Transport: newTransport(&cfg.Server)}
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
	s, err := New(cfg.Server, Deps{Picker: pk, Health: h, Nodes: nodes, Ejector: h, Registry: reg, Logger: logger, Flow: cfg.Flow})
	if err != nil {
		return nil, err
	}
	h.OnEject(s.ObserveEjection)
	h.OnSweep(s.ForgetDeparted)
	return &Stack{Server: s, Picker: p, Health: h}, nil
}

// Start starts the health probes and the overlay expiry. It does not block; serve
// Stack.Server.Handler() (or call Server.Start) to take requests.
func (st *Stack) Start(ctx context.Context) {
	st.Health.Start(ctx)
	st.Picker.Start(ctx)
}

// Shutdown drains the front door within ctx, then stops the background loops.
func (st *Stack) Shutdown(ctx context.Context) error {
	err := st.Server.Shutdown(ctx)
	st.Picker.Close()
	st.Health.Close()
	return err
}
