package frontdoor

import (
	"errors"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"body":       func(c *Config) { c.MaxBodyBytes = 0 },
		"upstream":   func(c *Config) { c.UpstreamTimeout = -1 },
		"body time":  func(c *Config) { c.BodyTimeout = 0 },
		"first byte": func(c *Config) { c.FirstByteCeiling = c.FirstByteFloor - time.Millisecond },
		"idle":       func(c *Config) { c.StreamIdleTimeout = 0 },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: invalid config accepted (%v)", name, err)
		}
	}
	// The service's body budget must hold a body at the cap twice (while its chunks are joined).
	sc := requests.DefaultConfig()
	sc.MaxBodyBufferBytes = 2*MaxBodyBytes - 1
	svc := newServiceWith(t, sc, requests.Deps{Picker: newPolicyPicker(t, &nodeList{}, routing.NewIndex(routing.DefaultIndexConfig()))})
	if _, err := New(DefaultConfig(), Deps{Service: svc}); !errors.Is(err, ErrConfig) {
		t.Errorf("a body budget under twice the body cap: %v", err)
	}
	if _, err := New(DefaultConfig(), Deps{}); !errors.Is(err, ErrConfig) {
		t.Errorf("no service: %v", err)
	}
}
