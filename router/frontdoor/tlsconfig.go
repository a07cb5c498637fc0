package frontdoor

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ServerTLS builds the front door's HTTPS configuration from PEM files: certFile and keyFile are
// the server's certificate and key; a non-empty clientCAFile requires and verifies client
// certificates signed by it (mTLS from clients). TLS 1.2 is the floor: every OpenAI client
// library speaks 1.3, and 1.2 is what older proxies in front of routers still use.
func ServerTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load server certificate: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pool, err := loadPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// ClientTLS builds the configuration toward engines from PEM files: caFile (optional, else the
// system roots) verifies the engines' certificates; certFile and keyFile (optional, together)
// are the router's client certificate for mTLS toward the nodes.
func ClientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%w: a client certificate needs both a certificate and a key file", ErrConfig)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if caFile != "" {
		pool, err := loadPool(caFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	return c, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrConfig, file)
	}
	return pool, nil
}
