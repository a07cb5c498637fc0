package pins

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// testPKI returns server and client TLS configs for mTLS on 127.0.0.1 from a fresh CA.
func testPKI(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pins test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "router"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	server = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	client = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13}
	return server, client
}

func TestMutualTLSCluster(t *testing.T) {
	server, client := testPKI(t)
	c := newCluster(t, 3, func(cfg *Config) { cfg.ServerTLS, cfg.ClientTLS = server, client })
	mustWrite(t, c.follower().store, putAdapter(5))
	c.waitConverged(10 * time.Second)
	for _, nd := range c.live() {
		if _, ok := nd.store.fsm.Adapter(5); !ok {
			t.Fatalf("%s lacks the write", nd.id)
		}
	}
	// A member without a client certificate is refused by the transport.
	noCert := client.Clone()
	noCert.Certificates = nil
	sl := &streamLayer{clientTLS: noCert}
	conn, err := sl.Dial(raft.ServerAddress(c.nodes[0].raftAddr), time.Second)
	if err == nil {
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = conn.Write([]byte{0})
		_, err = conn.Read(make([]byte, 1))
	}
	if err == nil {
		t.Fatal("a client without a certificate talked to the raft transport")
	}
	// And a plain TCP member cannot talk to it either.
	plain := &streamLayer{}
	if conn, err := plain.Dial(raft.ServerAddress(c.nodes[0].raftAddr), time.Second); err == nil {
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = conn.Write([]byte("plaintext raft rpc"))
		if _, err := conn.Read(make([]byte, 64)); err == nil {
			t.Log("server answered plaintext with a TLS alert (expected bytes, not raft)")
		}
		conn.Close()
	}
}

func TestAdvertiseMustBeDialable(t *testing.T) {
	if _, err := newStreamLayer("0.0.0.0:0", "", nil, nil); err == nil {
		t.Fatal("accepted an unspecified advertise address")
	}
	sl, err := newStreamLayer("127.0.0.1:0", "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	if sl.Addr().(*net.TCPAddr).Port == 0 {
		t.Fatal("advertised port 0")
	}
}

func TestReconcile(t *testing.T) {
	c := newCluster(t, 3, nil)
	// A fourth router appears; the leader keeps 3 voters.
	c.nodes = append(c.nodes, &testNode{id: "r3", dir: filepath.Join(t.TempDir(), "r3")})
	c.start(3, false)
	members := func() []Member {
		var out []Member
		for _, nd := range c.live() {
			out = append(out, Member{ID: nd.id, RaftAddr: nd.raftAddr, GRPCAddr: nd.grpcAddr})
		}
		return out
	}
	var ld *testNode
	waitFor(t, 10*time.Second, "a leader", func() bool {
		for _, nd := range c.nodes[:3] {
			if nd.store.IsLeader() {
				ld = nd
				return true
			}
		}
		return false
	})
	ld.store.cfg.Voters = 3
	if err := ld.store.Reconcile(ctxT(t, 10*time.Second), members()); err != nil {
		t.Fatal(err)
	}
	servers := func() string {
		f := ld.store.raft.GetConfiguration()
		if err := f.Error(); err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, s := range f.Configuration().Servers {
			ids[string(s.ID)] = true
		}
		return fmt.Sprint(ids)
	}
	if got := servers(); got != "map[r0:true r1:true r2:true]" {
		t.Fatalf("voters after reconcile at capacity: %s", got)
	}
	// A voter dies: the leader removes it and promotes the spare.
	var dead int
	for i, nd := range c.nodes[:3] {
		if nd != ld {
			dead = i
			break
		}
	}
	c.kill(dead)
	if err := ld.store.Reconcile(ctxT(t, 10*time.Second), members()); err != nil {
		t.Fatal(err)
	}
	got := servers()
	if got == "" || !strings.Contains(got, "r3:true") || strings.Contains(got, c.nodes[dead].id+":true") {
		t.Fatalf("voters after a death: %s", got)
	}
	mustWrite(t, c.nodes[3].store, putAdapter(9)) // the new voter forwards writes too
}
