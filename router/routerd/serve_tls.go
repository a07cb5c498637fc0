package routerd

import (
	"crypto/tls"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prefixmesh/prefixmesh/internal/tlsfiles"
)

// tlsSetup is every TLS configuration the flags describe; nil fields mean plaintext.
type tlsSetup struct {
	cluster, clusterClient *tls.Config // --tls-*: gRPC and Raft servers; dialling nodes and routers
	http                   *tls.Config // --http-tls-*: the front door's listener
	metrics                *tls.Config // --metrics-tls-*: --metrics-listen's listener
	upstream               *tls.Config // --upstream-tls-*: toward engines (https:// URLs)
}

func loadTLS(cfg ServeConfig) (tlsSetup, error) {
	var t tlsSetup
	var err error
	if cfg.TLSCert != "" {
		if t.cluster, err = tlsfiles.Server(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA); err != nil {
			return t, err
		}
		if t.clusterClient, err = tlsfiles.Client(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA); err != nil {
			return t, err
		}
		t.clusterClient.ServerName = cfg.TLSServerName
	}
	if cfg.HTTPTLSCert != "" {
		if t.http, err = tlsfiles.Server(cfg.HTTPTLSCert, cfg.HTTPTLSKey, cfg.HTTPTLSClientCA); err != nil {
			return t, err
		}
	}
	if cfg.MetricsTLSCert != "" {
		if t.metrics, err = tlsfiles.Server(cfg.MetricsTLSCert, cfg.MetricsTLSKey, cfg.MetricsTLSClientCA); err != nil {
			return t, err
		}
	}
	if cfg.UpstreamTLSCA != "" || cfg.UpstreamTLSCert != "" {
		if t.upstream, err = tlsfiles.Client(cfg.UpstreamTLSCert, cfg.UpstreamTLSKey, cfg.UpstreamTLSCA); err != nil {
			return t, err
		}
	}
	return t, nil
}

// grpcServerCreds are the gRPC server's transport credentials.
func (t tlsSetup) grpcServerCreds() credentials.TransportCredentials {
	if t.cluster == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(t.cluster)
}

// dialOption is how the router dials nodes and other routers.
func (t tlsSetup) dialOption() grpc.DialOption {
	if t.clusterClient == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(t.clusterClient))
}
