package flow

import (
	"context"
	"testing"
)

func idleFleet(n int) *fakeSource {
	src := &fakeSource{}
	src.set(make([]NodeLoad, n)...)
	return src
}

// TestAdmitFastPathAllocs: a request through an unsaturated fleet allocates nothing (the
// release function is the pool's own, the tenant's counters are looked up, not made).
func TestAdmitFastPathAllocs(t *testing.T) {
	c, _ := newTestController(t, idleFleet(1000), nil, nil) // headroom 5,000
	r := Request{Model: "m", Priority: "critical", Tenant: "acme"}
	rel, err := c.Admit(context.Background(), r) // reads the view, makes the pool and tenant
	if err != nil {
		t.Fatal(err)
	}
	rel()
	if a := testing.AllocsPerRun(1000, func() {
		rel, err := c.Admit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		rel()
	}); a != 0 {
		t.Fatalf("%v allocations per admitted request", a)
	}
}

// BenchmarkAdmitFastPath is the cost flow control adds to a request while the fleet is not
// saturated, from all cores at once.
func BenchmarkAdmitFastPath(b *testing.B) {
	src := idleFleet(64)
	c, err := New(DefaultConfig(), src, nil)
	if err != nil {
		b.Fatal(err)
	}
	r := Request{Model: "m", Tenant: "acme"}
	if _, err := c.Admit(context.Background(), r); err != nil {
		b.Fatal(err)
	}
	c.pool("m").budget.Store(1 << 40) // the loop's refresh, without the loop
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rel, err := c.Admit(context.Background(), r)
			if err != nil {
				b.Fatal(err)
			}
			rel()
		}
	})
}
