package cluster

import (
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Flags are the gossip flags that cmd/node and cmd/router share, so that both daemons spell
// them the same way. Apply maps them onto a Config.
type Flags struct {
	// Listen is the gossip bind address, host:port (UDP and TCP). Default 0.0.0.0:7946,
	// memberlist's port, on every interface because peers are on other hosts.
	Listen string
	// Advertise is the address peers are told, host or host:port; empty means the bind address
	// (or, for 0.0.0.0, the first private address memberlist finds).
	Advertise string
	// Join lists seeds (repeatable --join): host:port, host, or dns+srv:NAME.
	Join []string
	// KeyFile holds base64 AES keys (16, 24 or 32 bytes), one per line, the first primary.
	KeyFile string
	// Insecure allows plaintext gossip when no key file is given.
	Insecure bool
	// Label is the cluster label bound into every packet.
	Label string
}

// DefaultLabel is the cluster label unless --gossip-label says otherwise.
const DefaultLabel = "prefixmesh"

// DefaultFlags returns the defaults documented on Flags.
func DefaultFlags() Flags {
	return Flags{Listen: "0.0.0.0:7946", Label: DefaultLabel}
}

// Register binds the flags on fs with f's values as defaults.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Listen, "gossip-listen", f.Listen, "gossip bind `host:port` (UDP and TCP; port 0 picks a free port)")
	fs.StringVar(&f.Advertise, "gossip-advertise", f.Advertise, "gossip address announced to peers, `host[:port]` (default: the bind address)")
	fs.Func("join", "gossip seed to join, `host:port`, host or dns+srv:NAME (repeatable)", func(s string) error {
		for _, part := range strings.Split(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				f.Join = append(f.Join, part)
			}
		}
		return nil
	})
	fs.StringVar(&f.KeyFile, "gossip-key-file", f.KeyFile, "`file` of base64 gossip encryption keys (16, 24 or 32 bytes), one per line, first is primary")
	fs.BoolVar(&f.Insecure, "insecure-gossip", f.Insecure, "allow plaintext gossip when no --gossip-key-file is given (never in production)")
	fs.StringVar(&f.Label, "gossip-label", f.Label, "cluster `label` bound into every gossip packet; clusters with different labels ignore each other")
}

// Validate checks the flags without reading files.
func (f Flags) Validate() error {
	if _, _, err := splitListen(f.Listen); err != nil {
		return fmt.Errorf("--gossip-listen: %w", err)
	}
	if f.KeyFile == "" && !f.Insecure {
		return fmt.Errorf("--gossip-key-file: required (or --insecure-gossip to allow plaintext)")
	}
	return nil
}

// Apply sets cfg's network, join and encryption fields from f, reading the key file.
func (f Flags) Apply(cfg *Config) error {
	host, port, err := splitListen(f.Listen)
	if err != nil {
		return fmt.Errorf("--gossip-listen: %w", err)
	}
	cfg.BindAddr, cfg.BindPort = host, port
	if f.Advertise != "" {
		h, p, err := splitHostPort(f.Advertise, port)
		if err != nil {
			return fmt.Errorf("--gossip-advertise: %w", err)
		}
		cfg.AdvertiseAddr, cfg.AdvertisePort = h, p
	}
	cfg.Join = append([]string(nil), f.Join...)
	cfg.Label = f.Label
	cfg.InsecureGossip = f.Insecure
	cfg.Keys = nil
	if f.KeyFile != "" {
		keys, err := ReadKeyFile(f.KeyFile)
		if err != nil {
			return err
		}
		cfg.Keys = keys
	}
	return nil
}

func splitListen(s string) (string, int, error) {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("%q: want host:port: %w", s, err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", s)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}
