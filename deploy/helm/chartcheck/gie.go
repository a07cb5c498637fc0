package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The Gateway API Inference Extension's InferencePool, v1 (inference.networking.k8s.io), written
// from kubernetes-sigs/gateway-api-inference-extension api/v1/inferencepool_types.go and
// shared_types.go: only the fields a manifest sets, so that strict decoding catches a misspelt
// one. Its Go module is not fetched here (it would pull controller-runtime into this module).
type inferencePool struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   map[string]any    `json:"metadata"`
	Spec       inferencePoolSpec `json:"spec"`
}

type inferencePoolSpec struct {
	// Selector is a LabelSelector of matchLabels only (shared_types.go LabelSelector).
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	// TargetPorts holds exactly one port in v1 (MinItems=1, MaxItems=1).
	TargetPorts       []poolPort        `json:"targetPorts"`
	EndpointPickerRef endpointPickerRef `json:"endpointPickerRef"`
}

type poolPort struct {
	Number int32 `json:"number"`
}

type endpointPickerRef struct {
	Group *string `json:"group,omitempty"`
	// Kind defaults to Service; Port is required for a Service (the service port, not the
	// target port).
	Kind        string    `json:"kind,omitempty"`
	Name        string    `json:"name"`
	Port        *poolPort `json:"port,omitempty"`
	FailureMode string    `json:"failureMode,omitempty"` // FailOpen or FailClose (default)
}

// httpRoute is the part of Gateway API's HTTPRoute (gateway.networking.k8s.io/v1,
// kubernetes-sigs/gateway-api apis/v1/httproute_types.go) the chart's example sets.
type httpRoute struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   map[string]any `json:"metadata"`
	Spec       struct {
		ParentRefs []struct {
			Group     string `json:"group,omitempty"`
			Kind      string `json:"kind,omitempty"`
			Name      string `json:"name"`
			Namespace string `json:"namespace,omitempty"`
		} `json:"parentRefs"`
		Hostnames []string `json:"hostnames,omitempty"`
		Rules     []struct {
			Matches []struct {
				Path struct {
					Type  string `json:"type"`
					Value string `json:"value"`
				} `json:"path"`
			} `json:"matches"`
			BackendRefs []struct {
				Group string `json:"group"`
				Kind  string `json:"kind"`
				Name  string `json:"name"`
			} `json:"backendRefs"`
			Timeouts struct {
				Request string `json:"request,omitempty"`
			} `json:"timeouts"`
		} `json:"rules"`
	} `json:"spec"`
}

// checkGateway checks the InferencePool and HTTPRoute against the rest of the chart: the pool's
// endpoint picker is a port of a rendered Service whose target is the router's ext-proc port, which
// the router's flags serve; its selector selects the node agents' pods (which hold the engines)
// and its target port is the engine container's, and no prefill-only pool is among them; the
// route's backend is the pool.
func checkGateway(pools []inferencePool, routes []httpRoute, services []corev1.Service, router appsv1.StatefulSet,
	nodes []appsv1.DaemonSet, routerFlags, nodeFlags string) error {
	if len(pools) == 0 {
		if len(routes) > 0 {
			return errors.New("an HTTPRoute without an InferencePool")
		}
		return nil
	}
	if len(pools) != 1 {
		return fmt.Errorf("%d InferencePools, want one", len(pools))
	}
	p := pools[0]
	ref := p.Spec.EndpointPickerRef
	switch {
	case p.APIVersion != "inference.networking.k8s.io/v1":
		return fmt.Errorf("InferencePool apiVersion %q", p.APIVersion)
	case len(p.Spec.TargetPorts) != 1:
		return fmt.Errorf("InferencePool has %d target ports, v1 takes exactly one", len(p.Spec.TargetPorts))
	case ref.Kind != "" && ref.Kind != "Service", ref.Port == nil:
		return errors.New("InferencePool endpointPickerRef must name a Service and its port")
	case ref.FailureMode != "" && ref.FailureMode != "FailOpen" && ref.FailureMode != "FailClose":
		return fmt.Errorf("InferencePool failureMode %q", ref.FailureMode)
	}
	var target string
	for _, s := range services {
		if s.Name != ref.Name {
			continue
		}
		for _, sp := range s.Spec.Ports {
			if sp.Port == ref.Port.Number {
				target = sp.TargetPort.String()
			}
		}
	}
	if target == "" {
		return fmt.Errorf("InferencePool's endpoint picker %s:%d is no rendered Service port", ref.Name, ref.Port.Number)
	}
	var eppPort int32
	for _, cp := range router.Spec.Template.Spec.Containers[0].Ports {
		if cp.Name == target || strconv.Itoa(int(cp.ContainerPort)) == target {
			eppPort = cp.ContainerPort
		}
	}
	served := false
	for _, l := range strings.Split(routerFlags, "\n") {
		served = served || strings.TrimSpace(l) == fmt.Sprintf("--ext-proc-listen=:%d", eppPort)
	}
	if eppPort == 0 || !served {
		return fmt.Errorf("the endpoint picker's target %q is not a router port served by --ext-proc-listen", target)
	}
	selected := false
	for _, ds := range nodes {
		labels, ok := ds.Spec.Template.Labels, true
		for k, v := range p.Spec.Selector.MatchLabels {
			ok = ok && labels[k] == v
		}
		if !ok || len(p.Spec.Selector.MatchLabels) == 0 {
			continue
		}
		// A prefill-only engine cannot finish a request: the gateway must not pick it.
		if role := agentRole(ds, flagLines(nodeFlags)); role == "prefill" {
			return fmt.Errorf("the InferencePool selects DaemonSet %q, whose agents run --role=prefill", ds.Name)
		}
		selected = true
		ports := false
		for _, c := range ds.Spec.Template.Spec.Containers {
			for _, cp := range c.Ports {
				ports = ports || cp.ContainerPort == p.Spec.TargetPorts[0].Number
			}
		}
		if !ports && !ds.Spec.Template.Spec.HostNetwork {
			return fmt.Errorf("the selected node pods expose no port %d", p.Spec.TargetPorts[0].Number)
		}
	}
	if !selected && len(nodes) > 0 {
		return errors.New("the InferencePool's selector matches no node agent pod")
	}
	for _, r := range routes {
		if r.APIVersion != "gateway.networking.k8s.io/v1" || len(r.Spec.ParentRefs) == 0 || len(r.Spec.Rules) == 0 {
			return errors.New("an HTTPRoute needs gateway.networking.k8s.io/v1, a parent and a rule")
		}
		for _, rule := range r.Spec.Rules {
			for _, b := range rule.BackendRefs {
				if b.Group != "inference.networking.k8s.io" || b.Kind != "InferencePool" || b.Name != p.Metadata["name"] {
					return fmt.Errorf("HTTPRoute backend %s/%s %q is not the InferencePool", b.Group, b.Kind, b.Name)
				}
			}
		}
	}
	return nil
}

func decodePool(doc []byte) (inferencePool, error) {
	var p inferencePool
	err := yaml.UnmarshalStrict(doc, &p)
	return p, err
}

func decodeRoute(doc []byte) (httpRoute, error) {
	var r httpRoute
	err := yaml.UnmarshalStrict(doc, &r)
	return r, err
}
