package routerd

import (
	"context"
	"testing"
)

func TestRaftAdvertise(t *testing.T) {
	for _, c := range []struct {
		listen, advertise, gossip, want string
	}{
		{"127.0.0.1:7000", "", "", "127.0.0.1:7000"},
		{"127.0.0.1:0", "", "", ""}, // the store advertises what it binds
		{":7000", "", "10.1.2.3", "10.1.2.3:7000"},
		{"0.0.0.0:7000", "", "10.1.2.3", "10.1.2.3:7000"},
		{":7000", "127.0.0.2:7100", "10.1.2.3", "127.0.0.2:7100"},
	} {
		cfg := DefaultServeConfig()
		cfg.RaftListen, cfg.RaftAdvertise = c.listen, c.advertise
		got, err := raftAdvertise(context.Background(), cfg, c.gossip, 0)
		if err != nil || got != c.want {
			t.Errorf("raftAdvertise(listen %q, advertise %q, gossip %q) = %q, %v; want %q", c.listen, c.advertise, c.gossip, got, err, c.want)
		}
	}
	cfg := DefaultServeConfig()
	cfg.RaftAdvertise = "no-such-host.invalid:7000"
	if _, err := raftAdvertise(context.Background(), cfg, "", 0); err == nil {
		t.Error("an unresolvable --raft-advertise was accepted")
	}
}
