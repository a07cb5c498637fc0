package routerd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prefixmesh/prefixmesh/internal/connstats"
	"github.com/prefixmesh/prefixmesh/internal/tlsfiles"
	"github.com/prefixmesh/prefixmesh/router/extproc"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// endpointPicker is the Gateway API Inference Extension endpoint picker on its own listener:
// ext_proc over the request service the front door also serves through (parse, tokenizer,
// pinned picker, in-flight accounting), with grpc.health.v1 for liveness, readiness and ext_proc.
type endpointPicker struct {
	epp   *extproc.Server
	srv   *grpc.Server
	lis   net.Listener
	conns *connstats.Counter
}

// ExtProcConfig is the endpoint picker's part of ServeConfig; every field maps 1:1 to a flag.
type ExtProcConfig struct {
	// Listen, when set, serves the Gateway API Inference Extension endpoint picker (Envoy
	// ext_proc, router/extproc) and its grpc.health.v1 on this host:port. Default "" (off); the
	// chart sets :9002, the port an InferencePool names by convention.
	Listen string
	// Fallbacks is how many next-best endpoints follow the chosen one in the picker's answer
	// (extproc.Config.Fallbacks): 0, since a plain ORIGINAL_DST cluster takes one address; 1 or 2
	// for gateways that walk the list on retries.
	Fallbacks int
	// TLSCert and TLSKey serve the picker over TLS with this certificate. SelfSigned serves TLS
	// with a certificate generated at start, as GIE's reference picker does by default (gateways
	// that speak TLS to the picker skip verification: kgateway, Istio with the DestinationRule
	// in docs/gateway.md). Neither: plaintext gRPC, for a gateway on the same host.
	TLSCert, TLSKey string
	SelfSigned      bool
	// TLSClientCA requires the gateway's client certificate, signed by this CA (Envoy presents
	// one to an ext_proc cluster whose transport socket names it): whoever reaches the picker
	// chooses engines and reads prompts, so off loopback the rule asks for it unless
	// NoClientAuth says the gateways present none. Insecure allows plaintext off loopback.
	TLSClientCA            string
	NoClientAuth, Insecure bool
}

// maxExtProcFallbacks bounds --ext-proc-fallbacks: a gateway's retry budget is a few attempts,
// and every endpoint listed is a candidate scored for nothing if it is never tried.
const maxExtProcFallbacks = 8

func addExtProcFlags(fs *flag.FlagSet, cfg *ServeConfig) {
	e := &cfg.ExtProc
	fs.StringVar(&e.Listen, "ext-proc-listen", e.Listen, "serve the inference gateway endpoint picker (Envoy ext_proc) on `host:port` (default: off; :9002 in the chart)")
	fs.IntVar(&e.Fallbacks, "ext-proc-fallbacks", e.Fallbacks, "endpoint picker: next-best `endpoints` listed after the chosen one, for gateways that retry down the list (0: the chosen one alone, as an ORIGINAL_DST cluster needs)")
	fs.StringVar(&e.TLSCert, "ext-proc-tls-cert", e.TLSCert, "endpoint picker: serve TLS with this certificate `file` (PEM)")
	fs.StringVar(&e.TLSKey, "ext-proc-tls-key", e.TLSKey, "endpoint picker: the TLS private key `file` (PEM)")
	fs.BoolVar(&e.SelfSigned, "ext-proc-self-signed", e.SelfSigned, "endpoint picker: serve TLS with a certificate generated at start (gateways skip verification)")
	fs.StringVar(&e.TLSClientCA, "ext-proc-tls-client-ca", e.TLSClientCA, "endpoint picker: require gateways' client certificates signed by this CA `file` (PEM; mTLS)")
	fs.BoolVar(&e.NoClientAuth, "ext-proc-tls-no-client-auth", e.NoClientAuth, "endpoint picker: allow TLS without --ext-proc-tls-client-ca off loopback (for gateways that present no client certificate)")
	fs.BoolVar(&e.Insecure, "insecure-ext-proc", e.Insecure, "endpoint picker: allow plaintext gRPC on a non-loopback --ext-proc-listen (never in production)")
}

func (c ServeConfig) validateExtProc() error {
	e := c.ExtProc
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errServeConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case e.Listen != "" && !strings.Contains(e.Listen, ":"):
		return bad("--ext-proc-listen %q: want host:port", e.Listen)
	case e.Fallbacks < 0 || e.Fallbacks > maxExtProcFallbacks:
		return bad("--ext-proc-fallbacks %d: 0 to %d", e.Fallbacks, maxExtProcFallbacks)
	case (e.TLSCert == "") != (e.TLSKey == ""):
		return bad("--ext-proc-tls-cert and --ext-proc-tls-key: give both or neither")
	case e.TLSCert != "" && e.SelfSigned:
		return bad("--ext-proc-self-signed and --ext-proc-tls-cert: choose one")
	case e.TLSClientCA != "" && e.TLSCert == "" && !e.SelfSigned:
		return bad("--ext-proc-tls-client-ca: needs --ext-proc-tls-cert/--ext-proc-tls-key or --ext-proc-self-signed (mTLS is TLS plus client certificates)")
	}
	for _, f := range []struct{ flag, path string }{{"--ext-proc-tls-cert", e.TLSCert}, {"--ext-proc-tls-key", e.TLSKey}, {"--ext-proc-tls-client-ca", e.TLSClientCA}} {
		if f.path != "" {
			if _, err := os.Stat(f.path); err != nil {
				return bad("%s: %v", f.flag, err)
			}
		}
	}
	return nil
}

// extProcCreds are the picker's transport credentials: its own certificate or a self-signed
// one, requiring client certificates from --ext-proc-tls-client-ca when it is set; or
// plaintext. Never the cluster's CA for clients: a gateway's certificate must not also open
// the cluster's gRPC and Raft.
func extProcCreds(e ExtProcConfig) (credentials.TransportCredentials, error) {
	switch {
	case e.TLSCert != "":
		c, err := tlsfiles.Server(e.TLSCert, e.TLSKey, e.TLSClientCA)
		if err != nil {
			return nil, err
		}
		return credentials.NewTLS(c), nil
	case e.SelfSigned:
		cert, err := selfSigned(time.Now())
		if err != nil {
			return nil, fmt.Errorf("ext-proc self-signed certificate: %w", err)
		}
		c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if e.TLSClientCA != "" {
			if err := tlsfiles.RequireClientCerts(c, e.TLSClientCA); err != nil {
				return nil, err
			}
		}
		return credentials.NewTLS(c), nil
	}
	return insecure.NewCredentials(), nil
}

// selfSignedValidity is the generated certificate's lifetime: a year, far beyond a pod's life
// (a restart makes a new one), since nothing verifies it.
const selfSignedValidity = 365 * 24 * time.Hour

// selfSigned makes an ECDSA P-256 certificate for the picker, valid from now.
func selfSigned(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "prefixmesh-endpoint-picker"},
		DNSNames:     []string{"prefixmesh-endpoint-picker", "localhost"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(selfSignedValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// newEndpointPicker listens on cfg.ExtProc.Listen; nil when the flag is off.
func newEndpointPicker(cfg ServeConfig, fd *frontDoor, mirror requests.NodeStatusSource, conns *connstats.Counter,
	tp trace.TracerProvider, reg *prometheus.Registry, logger *slog.Logger) (*endpointPicker, error) {
	if cfg.ExtProc.Listen == "" {
		return nil, nil
	}
	creds, err := extProcCreds(cfg.ExtProc)
	if err != nil {
		return nil, err
	}
	ecfg := extproc.DefaultConfig()
	ecfg.Fallbacks = cfg.ExtProc.Fallbacks
	ecfg.TracerProvider = tp
	epp, err := extproc.New(ecfg, extproc.Deps{Picker: fd.Service, Nodes: requests.MirrorNodes{M: mirror},
		Registry: reg, Logger: logger})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.ExtProc.Listen)
	if err != nil {
		return nil, fmt.Errorf("ext-proc listen: %w", err)
	}
	opts := append(epp.GRPCOptions(), grpc.Creds(creds), grpc.StatsHandler(conns.StatsHandler()))
	srv := grpc.NewServer(opts...)
	epp.Register(srv)
	return &endpointPicker{epp: epp, srv: srv, lis: lis, conns: conns}, nil
}

// addr is the bound address, for the addr file and the log.
func (e *endpointPicker) addr() string { return e.lis.Addr().String() }

// serve serves until shutdown; its exit goes to served (nil for a requested stop).
func (e *endpointPicker) serve(served chan<- error) {
	go func() { served <- serveErr("ext-proc", e.srv.Serve(e.conns.Listener(e.lis))) }()
}

// shutdown reports NOT_SERVING, lets the streams in flight finish within ctx, then cuts the rest
// (each cut request is counted as failed and its in-flight count given back).
func (e *endpointPicker) shutdown(ctx context.Context, logger *slog.Logger) {
	e.epp.Shutdown()
	done := make(chan struct{})
	go func() { e.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		logger.Warn("endpoint picker drain incomplete; closing streams", "streams", e.epp.Streams())
		e.srv.Stop()
		<-done
	}
}
