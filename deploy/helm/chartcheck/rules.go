package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// minEngineStartup is the least startup budget a node agent beside a real engine may have: the
// agent reports NOT_SERVING until the engine answers, and vLLM loading an 8B model from a
// network volume and capturing its CUDA graphs takes minutes (a 120 s budget had kubelet restart
// agents over and over while the engine loaded). The chart's default is 30 minutes.
const minEngineStartup = 10 * time.Minute

// Well-known node labels (k8s.io/api/core/v1 well_known_labels.go).
const (
	hostnameKey = corev1.LabelHostname // kubernetes.io/hostname
)

// tokenizerDir is where the chart mounts router.tokenizerFiles.
const tokenizerDir = "/etc/prefixmesh/tokenizer"

// flagValue returns the value of --name in lines ("--name=value" or "--name value"), and
// whether it appears at all (a bare boolean flag has value "").
func flagValue(lines []string, name string) (string, bool) {
	for i, l := range lines {
		l = strings.TrimSpace(l)
		if v, ok := strings.CutPrefix(l, name+"="); ok {
			return v, true
		}
		if l == name {
			if i+1 < len(lines) && !strings.HasPrefix(lines[i+1], "-") {
				return lines[i+1], true
			}
			return "", true
		}
	}
	return "", false
}

func flagLines(file string) []string { return strings.Split(strings.TrimSpace(file), "\n") }

func container(spec corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	return nil
}

func budget(p *corev1.Probe) time.Duration {
	if p == nil {
		return 0
	}
	period, fails := p.PeriodSeconds, p.FailureThreshold
	if period == 0 {
		period = 10 // the API's default
	}
	if fails == 0 {
		fails = 3
	}
	return time.Duration(period*fails) * time.Second
}

// checkSeccomp: every container of the pod runs under the RuntimeDefault seccomp profile (set on
// the pod or on the container), which Pod Security "restricted" requires.
func checkSeccomp(role string, spec corev1.PodSpec) error {
	podLevel := spec.SecurityContext != nil && spec.SecurityContext.SeccompProfile != nil &&
		spec.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		own := c.SecurityContext != nil && c.SecurityContext.SeccompProfile != nil
		if own && c.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
			!own && !podLevel {
			return fmt.Errorf("%s: container %q has no RuntimeDefault seccomp profile (Pod Security restricted rejects the pod)", role, c.Name)
		}
	}
	return nil
}

// checkRestricted: the router's containers meet the rest of Pod Security "restricted" too
// (kubernetes.io/docs/concepts/security/pod-security-standards): non-root, no privilege
// escalation, every capability dropped.
func checkRestricted(role string, spec corev1.PodSpec) error {
	podNonRoot := spec.SecurityContext != nil && spec.SecurityContext.RunAsNonRoot != nil && *spec.SecurityContext.RunAsNonRoot
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		sc := c.SecurityContext
		switch {
		case !podNonRoot && (sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot):
			return fmt.Errorf("%s: container %q may run as root", role, c.Name)
		case sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			return fmt.Errorf("%s: container %q allows privilege escalation", role, c.Name)
		case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
			return fmt.Errorf("%s: container %q does not drop ALL capabilities", role, c.Name)
		}
	}
	return nil
}

// checkRouterPlacement: an odd number of Raft voters, kept apart by host (a required or preferred
// pod anti-affinity, or a topology spread, on kubernetes.io/hostname selecting the router pods):
// losing one host must not take two voters of three.
func checkRouterPlacement(sts appsv1.StatefulSet) error {
	if r := sts.Spec.Replicas; r != nil && *r%2 == 0 {
		return fmt.Errorf("router: %d replicas: Raft wants an odd number of voters", *r)
	}
	labels := sts.Spec.Template.Labels
	selects := func(sel map[string]string) bool {
		if len(sel) == 0 {
			return false
		}
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	spec := sts.Spec.Template.Spec
	if a := spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		for _, t := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			if t.TopologyKey == hostnameKey && t.LabelSelector != nil && selects(t.LabelSelector.MatchLabels) {
				return nil
			}
		}
		for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			t := w.PodAffinityTerm
			if t.TopologyKey == hostnameKey && t.LabelSelector != nil && selects(t.LabelSelector.MatchLabels) {
				return nil
			}
		}
	}
	for _, c := range spec.TopologySpreadConstraints {
		if c.TopologyKey == hostnameKey && c.LabelSelector != nil && selects(c.LabelSelector.MatchLabels) {
			return nil
		}
	}
	return errors.New("router: no pod anti-affinity or topology spread on " + hostnameKey + " selecting the router pods: two Raft voters may share a host")
}

// checkDomain: the Raft address routers advertise and the gossip join address use the cluster
// domain the chart was given, not a hard-coded svc.cluster.local.
func checkDomain(routerArgs, routerFlags []string, domain string) error {
	if domain == "" {
		return nil
	}
	for _, name := range []string{"--raft-advertise", "--join"} {
		v, ok := flagValue(slices.Concat(routerFlags, routerArgs), name)
		if !ok {
			return fmt.Errorf("router: no %s", name)
		}
		host := v
		if i := strings.LastIndexByte(v, ':'); i > 0 {
			host = v[:i]
		}
		if !strings.HasSuffix(host, ".svc."+domain) {
			return fmt.Errorf("router: %s=%s is not under the cluster domain %q", name, v, domain)
		}
	}
	return nil
}

// checkTokenizer: a router told to read a model's tokenizer from the mounted directory has it
// mounted, and a router in front of real engines does not estimate with a tokenizer no real model
// uses (every text prompt would be estimated at 0).
func checkTokenizer(sts appsv1.StatefulSet, routerFlags, nodeFlags []string) error {
	tok, _ := flagValue(routerFlags, "--tokenizer")
	c := container(sts.Spec.Template.Spec, "router")
	if c == nil {
		return errors.New("router: no container named router")
	}
	if strings.HasPrefix(tok, "hf:"+tokenizerDir) && !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.MountPath == tokenizerDir
	}) {
		return fmt.Errorf("router: --tokenizer=%s but nothing is mounted at %s", tok, tokenizerDir)
	}
	engine, _ := flagValue(nodeFlags, "--engine")
	if (engine == "vllm" || engine == "sglang") && (tok == "cl100k_base" || tok == "bytes" || tok == "") {
		return fmt.Errorf("router: --tokenizer=%q in front of %s engines: name the model's tokenizer (hf:, render:, engine)", tok, engine)
	}
	return nil
}

// checkNodePod: agents go only to selected nodes; an agent's startup budget covers its engine's;
// an engine sidecar has startup, readiness and liveness probes; and an injected vLLM or SGLang
// engine gets the flags that must match the agent's from the same values.
func checkNodePod(ds appsv1.DaemonSet, nodeFlags []string) error {
	spec := ds.Spec.Template.Spec
	engineKind, _ := flagValue(nodeFlags, "--engine")
	required := spec.Affinity != nil && spec.Affinity.NodeAffinity != nil &&
		spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil
	// A simulated fleet (staging) may run everywhere; agents of real engines go to GPU nodes.
	if engineKind != "sim" && len(spec.NodeSelector) == 0 && !required {
		return errors.New("node: no nodeSelector or required node affinity: agents would land on every node, CPU and control-plane nodes included")
	}
	agent := container(spec, "agent")
	if agent == nil {
		return errors.New("node: no container named agent")
	}
	// The pod's role label is what an InferencePool selects on: it must say the role the agent
	// gossips, or the gateway sends whole requests to a prefill-only engine.
	if role, label := agentRole(ds, nodeFlags), ds.Spec.Template.Labels[roleLabel]; label != role {
		return fmt.Errorf("node: DaemonSet %q labels its pods %s=%q, but its agent runs --role=%s", ds.Name, roleLabel, label, role)
	}
	if engineKind != "sim" && budget(agent.StartupProbe) < minEngineStartup {
		return fmt.Errorf("node: the agent's startup probe gives up after %v, but it is NOT_SERVING until its %s engine answers (want at least %v)",
			budget(agent.StartupProbe), engineKind, minEngineStartup)
	}
	eng := container(spec, "engine")
	if eng == nil {
		return nil
	}
	for name, p := range map[string]*corev1.Probe{"startup": eng.StartupProbe, "readiness": eng.ReadinessProbe, "liveness": eng.LivenessProbe} {
		if p == nil {
			return fmt.Errorf("node: the engine sidecar has no %s probe", name)
		}
	}
	if budget(agent.StartupProbe) < budget(eng.StartupProbe) {
		return fmt.Errorf("node: the agent's startup budget %v is shorter than its engine's %v", budget(agent.StartupProbe), budget(eng.StartupProbe))
	}
	if engineKind != "vllm" && engineKind != "sglang" {
		return nil
	}
	return checkEngineFlags(engineKind, eng, agent, nodeFlags)
}

// roleLabel is the pod label naming the agent's serving role.
const roleLabel = "prefixmesh.io/role"

// agentRole is the --role a DaemonSet's agent runs with: its container args win over the flag
// file, and without either the agent's default, both.
func agentRole(ds appsv1.DaemonSet, nodeFlags []string) string {
	role := "both"
	if v, ok := flagValue(nodeFlags, "--role"); ok {
		role = v
	}
	if a := container(ds.Spec.Template.Spec, "agent"); a != nil {
		if v, ok := flagValue(a.Args, "--role"); ok {
			role = v
		}
	}
	return role
}

// checkEngineFlags compares the engine's flags with the agent's: the block size, the KV-event
// endpoints and topic, the served model name, the port and the cached-token report, named as in
// vLLM's vllm/engine/arg_utils.py and vllm/config/kv_events.py and SGLang's
// python/sglang/srt/server_args.py.
func checkEngineFlags(kind string, eng, agent *corev1.Container, nodeFlags []string) error {
	args := eng.Args
	want := func(name, value string) error {
		got, ok := flagValue(args, name)
		if !ok || got != value {
			return fmt.Errorf("node: the %s engine's %s is %q (given: %v), want %q from the agent's flags", kind, name, got, ok, value)
		}
		return nil
	}
	bs, _ := flagValue(nodeFlags, "--block-size")
	model, _ := flagValue(nodeFlags, "--model")
	blockFlag, report := "--block-size", "--enable-prompt-tokens-details"
	if kind == "sglang" {
		blockFlag, report = "--page-size", "--enable-cache-report"
	}
	engineURL, _ := flagValue(agent.Args, "--engine-url")
	u, err := url.Parse(strings.ReplaceAll(engineURL, "$(POD_IP)", "10.0.0.7"))
	if err != nil {
		return fmt.Errorf("node: --engine-url %q: %w", engineURL, err)
	}
	for _, c := range [][2]string{{blockFlag, bs}, {report, ""}, {"--served-model-name", model}, {"--port", u.Port()}} {
		if err := want(c[0], c[1]); err != nil {
			return err
		}
	}
	if len(eng.Ports) == 0 || fmt.Sprint(eng.Ports[0].ContainerPort) != u.Port() {
		return fmt.Errorf("node: the engine container's port is not the agent's --engine-url port %s", u.Port())
	}
	raw, ok := flagValue(args, "--kv-events-config")
	if !ok {
		return fmt.Errorf("node: the %s engine has no --kv-events-config", kind)
	}
	var kv struct {
		Enable   *bool  `json:"enable_kv_cache_events"`
		Pub      string `json:"publisher"`
		Endpoint string `json:"endpoint"`
		Replay   string `json:"replay_endpoint"`
		Topic    string `json:"topic"`
	}
	if err := json.Unmarshal([]byte(raw), &kv); err != nil {
		return fmt.Errorf("node: --kv-events-config %s: %w", raw, err)
	}
	if kind == "vllm" && (kv.Enable == nil || !*kv.Enable) {
		return errors.New("node: vLLM's --kv-events-config lacks enable_kv_cache_events=true")
	}
	if kv.Pub != "zmq" {
		return fmt.Errorf("node: --kv-events-config publisher %q, want zmq", kv.Pub)
	}
	port := func(endpoint string) string {
		if i := strings.LastIndexByte(endpoint, ':'); i >= 0 {
			return endpoint[i+1:]
		}
		return ""
	}
	sub, dials := flagValue(nodeFlags, "--kv-events")
	listen, listens := flagValue(nodeFlags, "--kv-events-listen")
	replay, _ := flagValue(nodeFlags, "--kv-events-replay")
	topic, _ := flagValue(nodeFlags, "--kv-events-topic")
	// vLLM's and SGLang's publishers bind an endpoint holding "*" and connect to any other
	// (ZmqEventPublisher._socket_setup): an agent that listens needs an engine that connects to
	// that very address, an agent that dials needs an engine that binds.
	binds := strings.Contains(kv.Endpoint, "*")
	switch {
	case listens && (binds || kv.Endpoint != listen):
		return fmt.Errorf("node: the agent listens on %s (--kv-events-listen), but the engine's endpoint is %s, not a connect to it", listen, kv.Endpoint)
	case dials && (!binds || port(kv.Endpoint) != port(sub)):
		return fmt.Errorf("node: the engine publishes on %s, the agent subscribes to %s", kv.Endpoint, sub)
	case !listens && !dials:
		return errors.New("node: the agent has neither --kv-events nor --kv-events-listen")
	case port(kv.Replay) != port(replay):
		return fmt.Errorf("node: the engine's replay endpoint %q, the agent's %q", kv.Replay, replay)
	case kv.Topic != topic:
		return fmt.Errorf("node: the engine's topic %q, the agent's %q", kv.Topic, topic)
	}
	return nil
}

// checkNetworkPolicies checks, when the chart renders NetworkPolicies (networkPolicy.enabled),
// that every port a router or agent container opens is admitted by a policy selecting its
// pods, so that a changed port value cannot silently close a channel, and that no policy opens
// a port outside the chart's pods' container ports (the engines' KV-event ports stay closed).
// Pods on the host network are not subject to policies and are skipped.
func checkNetworkPolicies(pols []networkingv1.NetworkPolicy, router appsv1.StatefulSet, nodes []appsv1.DaemonSet) error {
	if len(pols) == 0 {
		return nil
	}
	pods := []struct {
		name   string
		labels map[string]string
		spec   corev1.PodSpec
	}{{"router", router.Spec.Template.Labels, router.Spec.Template.Spec}}
	for _, ds := range nodes {
		if !ds.Spec.Template.Spec.HostNetwork {
			pods = append(pods, struct {
				name   string
				labels map[string]string
				spec   corev1.PodSpec
			}{"node", ds.Spec.Template.Labels, ds.Spec.Template.Spec})
		}
	}
	type portKey struct {
		port  int32
		proto corev1.Protocol
	}
	for _, pod := range pods {
		open := map[portKey]bool{}
		for _, p := range pols {
			selects := true
			for k, v := range p.Spec.PodSelector.MatchLabels {
				selects = selects && pod.labels[k] == v
			}
			if !selects {
				continue
			}
			for _, rule := range p.Spec.Ingress {
				for _, np := range rule.Ports {
					proto := corev1.ProtocolTCP
					if np.Protocol != nil {
						proto = *np.Protocol
					}
					if np.Port == nil || np.Port.IntValue() == 0 {
						return fmt.Errorf("NetworkPolicy %q: ports must be numbers", p.Name)
					}
					open[portKey{int32(np.Port.IntValue()), proto}] = true
				}
			}
		}
		declared := map[portKey]bool{}
		for _, c := range pod.spec.Containers {
			for _, cp := range c.Ports {
				proto := cp.Protocol
				if proto == "" {
					proto = corev1.ProtocolTCP
				}
				k := portKey{cp.ContainerPort, proto}
				declared[k] = true
				if !open[k] {
					return fmt.Errorf("%s port %s %d/%s is admitted by no NetworkPolicy", pod.name, cp.Name, cp.ContainerPort, proto)
				}
			}
		}
		for k := range open {
			if !declared[k] {
				return fmt.Errorf("a NetworkPolicy opens %d/%s on %s pods, which declare no such port", k.port, k.proto, pod.name)
			}
		}
	}
	return nil
}
