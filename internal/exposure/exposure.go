// Package exposure is the one trust rule every TCP listener of both daemons follows, so that a
// listener's protection is decided the same way whichever daemon and port it is:
//
//   - on a loopback address (127.0.0.0/8, ::1, localhost) or a Unix socket, anything goes: only
//     processes on the host (or in the pod) reach it;
//   - on any other address (a wildcard bind such as ":7070" included), plaintext is refused
//     unless the listener's own --insecure-* flag says so;
//   - there, TLS must also authenticate clients (a client CA: mTLS) unless the listener's own
//     no-client-auth flag says TLS alone is enough.
//
// Check is a pure function of the flags, so both daemons call it from their flag validation
// (a refused configuration fails --validate-only and the start alike, before anything binds),
// and Log writes the line per listener that says at start what is open and which flag allowed
// it. Gossip is not a listener of this rule: it has its own key (--gossip-key-file, refused
// without one unless --insecure-gossip), which both encrypts and authenticates members.
package exposure

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
)

// Mode is how a listener protects its connections.
type Mode string

// The modes, weakest first.
const (
	Plaintext Mode = "plaintext"
	TLS       Mode = "TLS"  // server authenticated and traffic encrypted; any client accepted
	MTLS      Mode = "mTLS" // TLS, and clients must present a certificate the client CA signed
)

// Why a listener is allowed, when no flag is: the address itself.
const (
	AllowedLoopback = "loopback address"
	AllowedUnix     = "unix socket (file permissions)"
)

// ErrRefused marks a listener the rule refuses.
var ErrRefused = errors.New("listener refused")

// Listener is one listener as its flags describe it. The *Flag fields name the flags, so that a
// refusal tells the operator exactly what to set and the log names what allowed the listener.
type Listener struct {
	// Name says what the listener serves, e.g. "gRPC (Router, Pins)".
	Name string
	// ListenFlag and Addr are the listen flag and its value: host:port, or unix:///path.
	ListenFlag, Addr string
	// Cert is true when the listener serves TLS; CertFlag names the flag that turns it on.
	Cert     bool
	CertFlag string
	// ClientCA is true when clients must present a certificate the CA signed.
	ClientCA     bool
	ClientCAFlag string
	// Insecure is the listener's explicit permission to serve plaintext off loopback.
	Insecure     bool
	InsecureFlag string
	// NoClientAuth is the listener's explicit permission to serve TLS without client
	// certificates off loopback; "" when the listener offers no such permission.
	NoClientAuth     bool
	NoClientAuthFlag string
	// Exposes says what a stranger reaching the port could do, for the refusal.
	Exposes string
}

// Decision is what Check allowed: the listener, its mode and why it may be open.
type Decision struct {
	Name, ListenFlag, Addr string
	Mode                   Mode
	// AllowedBy is the flag that allowed this listener (e.g. "--tls-client-ca",
	// "--insecure-grpc") or AllowedLoopback / AllowedUnix.
	AllowedBy string
	// Weakened is true when an opt-out flag (--insecure-*, a no-client-auth flag) allowed it.
	Weakened bool
}

// Check applies the rule to l: the decision, or an error wrapping ErrRefused that names the
// flags that would allow the listener.
func (l Listener) Check() (Decision, error) {
	d := Decision{Name: l.Name, ListenFlag: l.ListenFlag, Addr: l.Addr, Mode: Plaintext}
	switch {
	case l.Cert && l.ClientCA:
		d.Mode = MTLS
	case l.Cert:
		d.Mode = TLS
	}
	switch {
	case d.Mode == MTLS:
		// Mutual TLS is allowed anywhere; the client CA is what protects it.
		d.AllowedBy = l.ClientCAFlag
		return d, nil
	case strings.HasPrefix(l.Addr, "unix://"):
		d.AllowedBy = AllowedUnix
		return d, nil
	case IsLoopback(l.Addr):
		d.AllowedBy = AllowedLoopback
		return d, nil
	}
	refuse := func(format string, args ...any) (Decision, error) {
		msg := fmt.Sprintf(format, args...)
		if l.Exposes != "" {
			msg += " (anyone who reaches it could " + l.Exposes + ")"
		}
		return Decision{}, fmt.Errorf("%w: %s %s: %s", ErrRefused, l.ListenFlag, l.Addr, msg)
	}
	switch d.Mode {
	case TLS:
		if !l.NoClientAuth {
			if l.NoClientAuthFlag == "" {
				return refuse("%s on a non-loopback address without client certificates: set %s", l.Name, l.ClientCAFlag)
			}
			return refuse("%s on a non-loopback address would accept any client: set %s (mTLS), listen on loopback, or pass %s to accept TLS without client certificates",
				l.Name, l.ClientCAFlag, l.NoClientAuthFlag)
		}
		d.AllowedBy, d.Weakened = l.NoClientAuthFlag, true
	default:
		if !l.Insecure {
			if l.CertFlag == "" {
				return refuse("%s would serve plaintext on a non-loopback address: listen on loopback, or pass %s", l.Name, l.InsecureFlag)
			}
			return refuse("%s would serve plaintext on a non-loopback address: set %s (and %s), listen on loopback, or pass %s",
				l.Name, l.CertFlag, l.ClientCAFlag, l.InsecureFlag)
		}
		d.AllowedBy, d.Weakened = l.InsecureFlag, true
	}
	return d, nil
}

// CheckAll checks every listener and returns the decisions in order, or the first refusal.
func CheckAll(ls []Listener) ([]Decision, error) {
	out := make([]Decision, 0, len(ls))
	for _, l := range ls {
		d, err := l.Check()
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// Log writes the start-up line of one open listener: its name, the address it bound (bound, or
// the configured address when bound is ""), its mode and what allowed it. A listener opened by
// an opt-out flag is logged as a warning, so that it stands out in a production log.
func Log(logger *slog.Logger, d Decision, bound string) {
	if bound == "" {
		bound = d.Addr
	}
	level, msg := slog.LevelInfo, "listener open"
	if d.Weakened {
		level, msg = slog.LevelWarn, "listener open with weakened protection"
	}
	logger.Log(context.Background(), level, msg, "listener", d.Name, "flag", d.ListenFlag, "addr", bound,
		"protection", string(d.Mode), "allowed_by", d.AllowedBy)
}

// Gossip is the decision of a gossip listener, for the same start-up log: gossip is outside
// Check's rule because memberlist has no TLS; its keyring (--gossip-key-file, AES-GCM with a
// shared key) both encrypts and admits members, and without a key the daemons refuse to start
// unless --insecure-gossip is given (cluster.Flags.Validate), wherever it listens.
func Gossip(addr string, keyed bool) Decision {
	d := Decision{Name: "gossip", ListenFlag: "--gossip-listen", Addr: addr, Mode: "keyring", AllowedBy: "--gossip-key-file"}
	if !keyed {
		d.Mode, d.AllowedBy, d.Weakened = Plaintext, "--insecure-gossip", true
	}
	return d
}

// IsLoopback reports whether a host:port listen address binds only loopback: a loopback IP or
// "localhost". An empty host, a wildcard or any other name is not: it may be reachable from
// other hosts.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
