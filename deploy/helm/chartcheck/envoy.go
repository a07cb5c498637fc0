package main

import (
	"errors"
	"fmt"
	"os"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // resolves the router filter's Any
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3" // resolves the fallback policy
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"                      // resolves HttpProtocolOptions
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// checkEnvoy decodes an Envoy bootstrap strictly into Envoy's own protos (an unknown field, a
// misspelt enum or a typed_config of an unknown type is an error), runs their validation rules,
// and checks what the endpoint picker needs: an ext_proc filter streaming both bodies
// (FULL_DUPLEX_STREAMED) and forwarding the envoy.lb metadata, and a cluster that sends to the
// destination: ORIGINAL_DST reading x-gateway-destination-endpoint, or the override_host policy
// reading it and reporting the served endpoint.
func checkEnvoy(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := b.ValidateAll(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var proc *extprocfilterv3.ExternalProcessor
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if f.GetTypedConfig().UnmarshalTo(&hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					var p extprocfilterv3.ExternalProcessor
					if hf.GetTypedConfig().UnmarshalTo(&p) == nil {
						proc = &p
					}
				}
			}
		}
	}
	if proc == nil {
		return fmt.Errorf("%s: no ext_proc filter", path)
	}
	pm := proc.GetProcessingMode()
	if pm.GetRequestBodyMode().String() != "FULL_DUPLEX_STREAMED" || pm.GetResponseBodyMode().String() != "FULL_DUPLEX_STREAMED" {
		return fmt.Errorf("%s: ext_proc body modes %v/%v, want FULL_DUPLEX_STREAMED both ways", path, pm.GetRequestBodyMode(), pm.GetResponseBodyMode())
	}
	forwards := false
	for _, ns := range proc.GetMetadataOptions().GetForwardingNamespaces().GetUntyped() {
		forwards = forwards || ns == "envoy.lb"
	}
	if !forwards {
		return fmt.Errorf("%s: ext_proc does not forward the envoy.lb metadata (the served endpoint)", path)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	if clusters[proc.GetGrpcService().GetEnvoyGrpc().GetClusterName()] == nil {
		return fmt.Errorf("%s: the ext_proc cluster %q is not defined", path, proc.GetGrpcService().GetEnvoyGrpc().GetClusterName())
	}
	for _, c := range clusters {
		if c.GetType() == clusterv3.Cluster_ORIGINAL_DST {
			o := c.GetOriginalDstLbConfig()
			if !o.GetUseHttpHeader() || o.GetHttpHeaderName() != "x-gateway-destination-endpoint" {
				return fmt.Errorf("%s: ORIGINAL_DST cluster %q does not read x-gateway-destination-endpoint", path, c.GetName())
			}
			return nil
		}
		for _, p := range c.GetLoadBalancingPolicy().GetPolicies() {
			var oh overridehostv3.OverrideHost
			if p.GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(&oh) != nil {
				continue
			}
			reads := false
			for _, src := range oh.GetOverrideHostSources() {
				reads = reads || src.GetHeader() == "x-gateway-destination-endpoint"
			}
			served := oh.GetSelectedHostKey()
			if !reads || served.GetKey() != "envoy.lb" || len(served.GetPath()) != 1 || served.GetPath()[0].GetKey() != "x-gateway-destination-endpoint-served" {
				return fmt.Errorf("%s: override_host on %q must read x-gateway-destination-endpoint and report envoy.lb x-gateway-destination-endpoint-served", path, c.GetName())
			}
			return nil
		}
	}
	return errors.New(path + ": no ORIGINAL_DST or override_host cluster reads the destination")
}
