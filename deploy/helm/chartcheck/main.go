// Command chartcheck decodes every manifest that `helm template` rendered strictly into its
// Kubernetes API type (an unknown or misspelt field is an error), checks the chart's own
// invariants (probes use grpc.health.v1, the grace period outlasts the drain, the router is a
// StatefulSet with stable storage), and writes each daemon's flags (the ConfigMap's flag files
// plus the container args) to a directory so the caller can run the binaries with
// --validate-only. It is its own module so the main module's go.sum stays free of Kubernetes.
//
// Usage: chartcheck -manifests rendered.yaml -flags-dir DIR
//
//	chartcheck -envoy deploy/envoy/envoy.yaml (an Envoy bootstrap, decoded into Envoy's protos)
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

func main() {
	manifests := flag.String("manifests", "", "rendered manifests (multi-document YAML)")
	flagsDir := flag.String("flags-dir", "", "directory to write router.args, node-<DaemonSet>.args (one per node pool) and node.args (the first pool's) into")
	root := flag.String("files-root", "", "rewrite "+mountRoot+" paths under this directory and create the mounted files there")
	domain := flag.String("cluster-domain", "", "the clusterDomain the chart was rendered with: Raft and gossip addresses must use it")
	envoy := flag.String("envoy", "", "instead, check this Envoy bootstrap (deploy/envoy) against Envoy's protos")
	flag.Parse()
	if *envoy != "" {
		if err := checkEnvoy(*envoy); err != nil {
			fmt.Fprintln(os.Stderr, "chartcheck:", err)
			os.Exit(1)
		}
		fmt.Println("chartcheck: envoy bootstrap ok")
		return
	}
	if err := run(*manifests, *flagsDir, *root, *domain); err != nil {
		fmt.Fprintln(os.Stderr, "chartcheck:", err)
		os.Exit(1)
	}
}

type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

func run(path, flagsDir, root, domain string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var (
		configMaps   []corev1.ConfigMap
		statefulSets []appsv1.StatefulSet
		daemonSets   []appsv1.DaemonSet
		services     []corev1.Service
		pools        []inferencePool
		routes       []httpRoute
		netpols      []networkingv1.NetworkPolicy
		kinds        = map[string]int{}
	)
	for i, doc := range splitDocs(raw) {
		var h header
		if err := yaml.Unmarshal(doc, &h); err != nil {
			return fmt.Errorf("document %d: %w", i, err)
		}
		where := fmt.Sprintf("%s %q", h.Kind, h.Metadata.Name)
		kinds[h.Kind]++
		switch h.Kind {
		case "ConfigMap":
			var o corev1.ConfigMap
			if err = yaml.UnmarshalStrict(doc, &o); err == nil && isDashboards(o) {
				err = checkDashboards(o)
				break
			}
			configMaps = append(configMaps, o)
		case "Secret":
			err = yaml.UnmarshalStrict(doc, &corev1.Secret{})
		case "Service":
			var o corev1.Service
			err = yaml.UnmarshalStrict(doc, &o)
			services = append(services, o)
		case "InferencePool":
			var o inferencePool
			o, err = decodePool(doc)
			pools = append(pools, o)
		case "HTTPRoute":
			var o httpRoute
			o, err = decodeRoute(doc)
			routes = append(routes, o)
		case "ServiceAccount":
			err = yaml.UnmarshalStrict(doc, &corev1.ServiceAccount{})
		case "StatefulSet":
			var o appsv1.StatefulSet
			err = yaml.UnmarshalStrict(doc, &o)
			statefulSets = append(statefulSets, o)
		case "DaemonSet":
			var o appsv1.DaemonSet
			err = yaml.UnmarshalStrict(doc, &o)
			daemonSets = append(daemonSets, o)
		case "NetworkPolicy":
			var o networkingv1.NetworkPolicy
			err = yaml.UnmarshalStrict(doc, &o)
			netpols = append(netpols, o)
		case "PodDisruptionBudget":
			err = yaml.UnmarshalStrict(doc, &policyv1.PodDisruptionBudget{})
		case "ServiceMonitor", "PodMonitor":
			err = checkMonitor(doc)
		case "PrometheusRule":
			err = checkPrometheusRule(doc)
		default:
			err = errors.New("unexpected kind (add it to chartcheck)")
		}
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	if len(statefulSets) != 1 || len(configMaps) != 1 {
		return fmt.Errorf("want one router StatefulSet and one ConfigMap, got %d and %d", len(statefulSets), len(configMaps))
	}
	flagFiles := configMaps[0].Data
	router := statefulSets[0]
	if len(router.Spec.VolumeClaimTemplates) == 0 && !hasVolume(router.Spec.Template.Spec, "data") {
		return errors.New("router StatefulSet has no data volume for Raft")
	}
	if err := checkPod("router", router.Spec.Template.Spec, flagFiles, "router.flags", filepath.Join(flagsDir, "router.args"), root); err != nil {
		return err
	}
	if err := checkGateway(pools, routes, services, router, daemonSets, flagFiles["router.flags"], flagFiles["node.flags"]); err != nil {
		return err
	}
	// Each DaemonSet (node pool) writes its own flags, node-<name>.args, as pools pass different
	// flags (--role, --kv-connector); node.args is the first's, for callers that check one.
	for i, ds := range daemonSets {
		outs := []string{"node-" + ds.Name + ".args"}
		if i == 0 {
			outs = append(outs, "node.args")
		}
		for _, out := range outs {
			if err := checkPod("node", ds.Spec.Template.Spec, flagFiles, "node.flags", filepath.Join(flagsDir, out), root); err != nil {
				return fmt.Errorf("DaemonSet %q: %w", ds.Name, err)
			}
		}
	}
	if err := checkRules(router, daemonSets, flagFiles, domain); err != nil {
		return err
	}
	if err := checkNetworkPolicies(netpols, router, daemonSets); err != nil {
		return err
	}
	fmt.Printf("chartcheck: %d documents decoded strictly (%v)\n", sum(kinds), kinds)
	return nil
}

// checkRules checks the chart's placement, security and engine-matching rules (rules.go).
func checkRules(router appsv1.StatefulSet, daemonSets []appsv1.DaemonSet, flagFiles map[string]string, domain string) error {
	routerFlags, nodeFlags := flagLines(flagFiles["router.flags"]), flagLines(flagFiles["node.flags"])
	spec := router.Spec.Template.Spec
	if err := checkSeccomp("router", spec); err != nil {
		return err
	}
	if err := checkRestricted("router", spec); err != nil {
		return err
	}
	if err := checkRouterPlacement(router); err != nil {
		return err
	}
	c := container(spec, "router")
	if c == nil {
		return errors.New("router: no container named router")
	}
	if err := checkDomain(c.Args, routerFlags, domain); err != nil {
		return err
	}
	if err := checkTokenizer(router, routerFlags, nodeFlags); err != nil {
		return err
	}
	for _, ds := range daemonSets {
		if err := checkSeccomp("node", ds.Spec.Template.Spec); err != nil {
			return err
		}
		if err := checkNodePod(ds, nodeFlags); err != nil {
			return err
		}
	}
	return nil
}

// checkPod verifies one daemon's pod and writes its effective flags (file first, then args, one
// per line; $(VAR) references replaced by a sample value) for the validate-only run.
func checkPod(role string, spec corev1.PodSpec, flagFiles map[string]string, flagKey, out, root string) error {
	if len(spec.Containers) == 0 {
		return fmt.Errorf("%s: no containers", role)
	}
	c := spec.Containers[0]
	// Probes ask grpc.health.v1, or with TLS on (kubelet's gRPC probes speak no TLS) the HTTP
	// /healthz that mirrors it.
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe} {
		if p == nil || (p.GRPC == nil && (p.HTTPGet == nil || p.HTTPGet.Path != "/healthz")) {
			return fmt.Errorf("%s: %s probe is neither grpc.health.v1 nor /healthz", role, name)
		}
	}
	drain, err := drainTimeout(flagFiles[flagKey])
	if err != nil {
		return fmt.Errorf("%s: %w", role, err)
	}
	if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= drain {
		return fmt.Errorf("%s: terminationGracePeriodSeconds must exceed the drain timeout %s", role, drain)
	}
	// Subcommands (positional args) first, then the file's flags, then the pod's own flags.
	var positional, flags []string
	for _, a := range c.Args {
		switch {
		case strings.HasPrefix(a, "--config="):
		case !strings.HasPrefix(a, "-"):
			positional = append(positional, a)
		default:
			flags = append(flags, strings.NewReplacer("$(POD_NAME)", "pod-0", "$(NODE_NAME)", "gpu-node-0", "$(POD_IP)", "10.0.0.7").Replace(a))
		}
	}
	lines := append(positional, strings.Split(strings.TrimSpace(flagFiles[flagKey]), "\n")...)
	lines = append(lines, flags...)
	lines, err = materialise(lines, root)
	if err != nil {
		return fmt.Errorf("%s: %w", role, err)
	}
	if out == "" || out == filepath.Base(out) {
		return nil
	}
	return os.WriteFile(out, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

func drainTimeout(flags string) (time.Duration, error) {
	for _, l := range strings.Split(flags, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "--drain-timeout="); ok {
			return time.ParseDuration(v)
		}
	}
	return 0, errors.New("no --drain-timeout in the flag file")
}

// checkMonitor decodes a Prometheus operator ServiceMonitor or PodMonitor strictly against the
// fields the chart uses (the operator's Go types would pull in its whole module).
func checkMonitor(doc []byte) error {
	var m struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       struct {
			Selector            map[string]any   `json:"selector"`
			Endpoints           []map[string]any `json:"endpoints"`
			PodMetricsEndpoints []map[string]any `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(doc, &m); err != nil {
		return err
	}
	if m.APIVersion != "monitoring.coreos.com/v1" || len(m.Spec.Endpoints)+len(m.Spec.PodMetricsEndpoints) == 0 {
		return errors.New("a monitor needs monitoring.coreos.com/v1 and an endpoint")
	}
	return nil
}

// checkPrometheusRule decodes a Prometheus operator PrometheusRule strictly against the fields
// of a rules file (promtool checks the rules themselves: scripts/checkrules.sh).
func checkPrometheusRule(doc []byte) error {
	var r struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       struct {
			Groups []struct {
				Name     string `json:"name"`
				Interval string `json:"interval"`
				Rules    []struct {
					Alert         string            `json:"alert"`
					Record        string            `json:"record"`
					Expr          string            `json:"expr"`
					For           string            `json:"for"`
					KeepFiringFor string            `json:"keep_firing_for"`
					Labels        map[string]string `json:"labels"`
					Annotations   map[string]string `json:"annotations"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(doc, &r); err != nil {
		return err
	}
	if r.APIVersion != "monitoring.coreos.com/v1" || len(r.Spec.Groups) == 0 {
		return errors.New("a PrometheusRule needs monitoring.coreos.com/v1 and a group")
	}
	for _, g := range r.Spec.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			return fmt.Errorf("group %q: needs a name and rules", g.Name)
		}
		for _, rule := range g.Rules {
			if rule.Expr == "" || (rule.Alert == "") == (rule.Record == "") {
				return fmt.Errorf("group %q: a rule needs an expr and one of alert or record", g.Name)
			}
			if rule.Alert != "" && (rule.Labels["severity"] == "" || rule.Annotations["runbook_url"] == "") {
				return fmt.Errorf("alert %s: needs a severity label and a runbook_url annotation", rule.Alert)
			}
		}
	}
	return nil
}

// isDashboards reports whether a ConfigMap holds Grafana dashboards (every key a .json file)
// rather than the daemons' flag files.
func isDashboards(cm corev1.ConfigMap) bool {
	if len(cm.Data) == 0 {
		return false
	}
	for k := range cm.Data {
		if !strings.HasSuffix(k, ".json") {
			return false
		}
	}
	return true
}

// checkDashboards checks that every dashboard in the ConfigMap is a JSON object with panels.
func checkDashboards(cm corev1.ConfigMap) error {
	for k, v := range cm.Data {
		var d struct {
			Title  string            `json:"title"`
			Panels []json.RawMessage `json:"panels"`
		}
		if err := json.Unmarshal([]byte(v), &d); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		if d.Title == "" || len(d.Panels) == 0 {
			return fmt.Errorf("%s: a dashboard needs a title and panels", k)
		}
	}
	return nil
}

func hasVolume(spec corev1.PodSpec, name string) bool {
	for _, v := range spec.Volumes {
		if v.Name == name {
			return true
		}
	}
	return false
}

func splitDocs(raw []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(raw, []byte("\n---")) {
		trimmed := bytes.TrimSpace(d)
		if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("---")) {
			continue
		}
		if !bytes.Contains(trimmed, []byte("kind:")) {
			continue // a document of only comments
		}
		docs = append(docs, d)
	}
	return docs
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
