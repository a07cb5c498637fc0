package drills

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// firstByteDeadline is the longest wait for a first byte the drills allow the front door: short
// enough that the SIGSTOP drill sees retries, long enough for a loaded machine's normal first
// byte (milliseconds). The flags are named outright: a router that no longer takes them fails
// to start, and the drills with it, rather than skipping the check.
const firstByteDeadline = 2 * time.Second

// firstByteFlags bound the front door's first-byte wait by firstByteDeadline.
var firstByteFlags = []string{
	fmt.Sprintf("--first-byte-timeout-floor=%v", firstByteDeadline/2),
	fmt.Sprintf("--first-byte-timeout-ceiling=%v", firstByteDeadline),
}

// cluster is the drills' fleet: three routers (Raft voters) and four node agents.
type cluster struct {
	*fleet
	routers   []*proc
	routerCCs []*grpc.ClientConn
	nodes     map[string]*proc
	killedAt  time.Time // when the kill drill killed its node
	downPorts portHold  // the killed node's ports, held until it restarts on them
}

func (c *cluster) routerArgs(i int) []string {
	args := []string{fmt.Sprintf("--node-id=router-%d", i), "--log-level=info",
		"--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--gossip-listen=127.0.0.1:0",
		"--gossip-key-file=" + c.key, "--raft-listen=127.0.0.1:0", fmt.Sprintf("--raft-dir=%s/router-%d-raft", c.dir, i),
		"--tokenizer=bytes", "--drain-timeout=10s"}
	if i == 0 {
		args = append(args, "--raft-bootstrap-expect=1") // starts a one-voter cluster; its reconcile adds the others
	} else {
		args = append(args, "--raft-bootstrap-expect=0", "--join="+c.routers[0].addrs["gossip"])
	}
	args = append(args, firstByteFlags...)
	return args
}

// anyPort are the listen addresses of a node agent that lets the OS pick its ports.
var anyPort = map[string]string{"grpc": "127.0.0.1:0", "http": "127.0.0.1:0", "gossip": "127.0.0.1:0"}

// nodeArgs are a node agent's flags; listen holds its grpc, http and gossip listen addresses
// (anyPort, or a restart's old ones).
func (c *cluster) nodeArgs(id string, listen map[string]string, keyFile string) []string {
	var seeds []string
	for _, r := range c.routers {
		seeds = append(seeds, r.addrs["gossip"])
	}
	return []string{"--node-id=" + id, "--log-level=info", "--engine=sim",
		"--grpc-listen=" + listen["grpc"], "--http-listen=" + listen["http"], "--gossip-listen=" + listen["gossip"],
		"--gossip-key-file=" + keyFile, "--join=" + strings.Join(seeds, ","),
		"--block-size=16", "--kv-blocks=8192", "--sim-prefill-tokens-per-s=2e6", "--sim-decode-tokens-per-s=800",
		"--drain-timeout=10s"}
}

func (c *cluster) startNode(id string, listen map[string]string) *proc {
	p := c.launch(id, c.nodeBin, c.nodeArgs(id, listen, c.key)...)
	c.nodes[id] = p
	return p
}

// startCluster launches the routers and nodes and returns once every router routes among the
// four nodes, serves its health, and the Raft configuration has three voters and a leader.
func startCluster(t *testing.T, f *fleet) *cluster {
	c := &cluster{fleet: f, nodes: map[string]*proc{}}
	for i := range 3 {
		c.routers = append(c.routers, c.launch(fmt.Sprintf("router-%d", i), c.rtrBin, c.routerArgs(i)...))
		c.routerCCs = append(c.routerCCs, dial(t, c.routers[i].addrs["grpc"]))
	}
	for i := range 4 {
		c.startNode(fmt.Sprintf("node-%d", i), anyPort)
	}
	for i := range c.routers {
		eventually(t, startWait, fmt.Sprintf("router-%d routes among 4 nodes", i), func() error {
			return c.candidatesAre(i, 4)
		})
		eventually(t, startWait, fmt.Sprintf("router-%d healthy", i), func() error {
			code, body, err := httpGet("http://" + c.routers[i].addrs["http"] + "/healthz")
			if err != nil || code != 200 {
				return fmt.Errorf("/healthz %d %q %v", code, body, err)
			}
			return nil
		})
	}
	eventually(t, startWait, "three Raft voters with a leader", func() error {
		m, err := c.members(0)
		if err != nil {
			return err
		}
		voters := 0
		for _, s := range m.GetServers() {
			if s.GetVoter() {
				voters++
			}
		}
		if voters != 3 || m.GetLeaderId() == "" {
			return fmt.Errorf("%d voters, leader %q", voters, m.GetLeaderId())
		}
		return nil
	})
	return c
}

// route asks router i where tokens should go (the index's view, no in-flight overlay).
func (c *cluster) route(i int, tokens []uint32) (*pb.RouteResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return pb.NewRouterClient(c.routerCCs[i]).Route(ctx, &pb.RouteRequest{Tokens: tokens})
}

func (c *cluster) candidatesAre(i, n int) error {
	r, err := c.route(i, []uint32{1, 2, 3})
	if err != nil {
		return err
	}
	if len(r.GetCandidates()) != n {
		return fmt.Errorf("%d candidates: %v", len(r.GetCandidates()), r.GetCandidates())
	}
	return nil
}

// candidate returns node's entry among router i's candidates for tokens, or nil.
func (c *cluster) candidate(i int, tokens []uint32, node string) (*pb.RouteCandidate, error) {
	r, err := c.route(i, tokens)
	if err != nil {
		return nil, err
	}
	for _, cand := range r.GetCandidates() {
		if cand.GetNodeId() == node {
			return cand, nil
		}
	}
	return nil, nil
}

func (c *cluster) members(i int) (*pb.PinsMembersResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return pb.NewPinsClient(c.routerCCs[i]).Members(ctx, &pb.PinsMembersRequest{})
}

func (c *cluster) routerHTTPs(except ...int) []string {
	var out []string
outer:
	for i, r := range c.routers {
		for _, e := range except {
			if i == e {
				continue outer
			}
		}
		out = append(out, r.addrs["http"])
	}
	return out
}

// figures collects what the drills measured, printed at the end and written to
// $PREFIXMESH_DRILLS_REPORT when set (scripts/test.sh prints it).
type figures struct {
	rows [][3]string // drill, figure, target
}

func (f *figures) add(drill, figure, target string) {
	f.rows = append(f.rows, [3]string{drill, figure, target})
}

func (f *figures) report(t *testing.T) {
	var b strings.Builder
	b.WriteString("| drill | measured | target |\n|---|---|---|\n")
	for _, r := range f.rows {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r[0], r[1], r[2])
	}
	t.Logf("fault drill figures:\n%s", b.String())
	if p := os.Getenv("PREFIXMESH_DRILLS_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			t.Errorf("write drills report: %v", err)
		}
	}
}
