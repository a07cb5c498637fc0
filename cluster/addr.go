package cluster

import (
	"net"
	"strconv"
)

// ReachableHost is the host other members should dial this process at: advertise when set, else
// the first non-loopback IPv4 address (a pod's IP in Kubernetes), else 127.0.0.1.
func ReachableHost(advertise string) string {
	if advertise != "" {
		return advertise
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// ReachableAddr is the address to announce for a listener: its own address unless it listens on
// every interface (":7070" in Kubernetes), then ReachableHost(advertise) with its port. A Unix
// socket is not reachable from other hosts: "".
func ReachableAddr(a net.Addr, advertise string) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return ""
	}
	if !tcp.IP.IsUnspecified() {
		return tcp.String()
	}
	return net.JoinHostPort(ReachableHost(advertise), strconv.Itoa(tcp.Port))
}
