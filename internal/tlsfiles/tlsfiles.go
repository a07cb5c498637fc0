// Package tlsfiles builds *tls.Config values from PEM files, the one place every daemon's TLS
// flags (--tls-*, --http-tls-*, --metrics-tls-*, --ext-proc-tls-*, --upstream-tls-*) are turned into configurations: a server
// configuration (mTLS when a client CA is given) and a client configuration (optional client
// certificate, optional CA replacing the system roots). TLS 1.2 is the floor: current clients
// speak 1.3, and 1.2 is what older proxies in front of routers still use.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ErrInvalid marks TLS settings that cannot work (a certificate without its key, a CA file
// with no certificate).
var ErrInvalid = errors.New("invalid TLS settings")

// Server loads certFile and keyFile as the server's identity; a non-empty clientCAFile
// requires and verifies client certificates signed by it.
func Server(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load server certificate: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		if err := RequireClientCerts(c, clientCAFile); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// RequireClientCerts makes the server configuration c refuse every client that does not present
// a certificate signed by a CA in clientCAFile (mTLS). It is Server's client-CA half, for servers
// whose certificate does not come from files (the endpoint picker's self-signed one).
func RequireClientCerts(c *tls.Config, clientCAFile string) error {
	pool, err := loadPool(clientCAFile)
	if err != nil {
		return err
	}
	c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	return nil
}

// Client builds a client configuration: caFile (optional, else the system roots) verifies the
// servers; certFile and keyFile (optional, together) are the client certificate for mTLS.
func Client(certFile, keyFile, caFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%w: a client certificate needs both a certificate and a key file", ErrInvalid)
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
		return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrInvalid, file)
	}
	return pool, nil
}
