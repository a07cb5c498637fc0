package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// srvPrefix marks a seed resolved through DNS SRV records (a Kubernetes headless service
// publishes one per ready pod with its port: "dns+srv:_gossip._udp.prefixmesh.ns.svc").
const srvPrefix = "dns+srv:"

// resolver is the part of net.Resolver seeds need; tests pass a fake.
type resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

var _ resolver = (*net.Resolver)(nil)

// resolveSeeds turns join entries into "ip:port" addresses: an SRV seed into every target's
// addresses at the record's port, a host name into every A/AAAA address (a headless service
// returns one per pod), a literal address as it is; defaultPort fills a missing port. It
// returns what resolved, and the errors of the seeds that did not.
func resolveSeeds(ctx context.Context, r resolver, seeds []string, defaultPort int) ([]string, error) {
	var out []string
	var errs []error
	add := func(host string, port int) {
		if ip := net.ParseIP(host); ip != nil {
			out = append(out, net.JoinHostPort(ip.String(), strconv.Itoa(port)))
			return
		}
		ips, err := r.LookupHost(ctx, host)
		if err != nil {
			errs = append(errs, fmt.Errorf("resolve %s: %w", host, err))
			return
		}
		for _, ip := range ips {
			out = append(out, net.JoinHostPort(ip, strconv.Itoa(port)))
		}
	}
	for _, s := range seeds {
		s = strings.TrimSpace(s)
		switch {
		case s == "":
		case strings.HasPrefix(s, srvPrefix):
			_, srvs, err := r.LookupSRV(ctx, "", "", strings.TrimPrefix(s, srvPrefix))
			if err != nil {
				errs = append(errs, fmt.Errorf("resolve %s: %w", s, err))
				continue
			}
			for _, srv := range srvs {
				add(strings.TrimSuffix(srv.Target, "."), int(srv.Port))
			}
		default:
			host, port, err := splitHostPort(s, defaultPort)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			add(host, port)
		}
	}
	if len(out) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%w: no seed addresses", ErrInvalid))
	}
	return out, errors.Join(errs...)
}

// splitHostPort splits "host:port", "[v6]:port", "host" or a bare IPv6 address.
func splitHostPort(s string, defaultPort int) (string, int, error) {
	if ip := net.ParseIP(strings.Trim(s, "[]")); ip != nil {
		return ip.String(), defaultPort, nil
	}
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return s, defaultPort, nil // no port
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("seed %q: %w: bad port", s, ErrInvalid)
	}
	return host, port, nil
}
