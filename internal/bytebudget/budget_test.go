package bytebudget

import (
	"sync"
	"testing"
)

// Take never lets the bytes held pass the limit, even under concurrent takers, and Give makes
// room again.
func TestBudget(t *testing.T) {
	b := New(100)
	if !b.Take(60) || b.Take(41) || !b.Take(40) || b.Held() != 100 {
		t.Fatalf("held %d", b.Held())
	}
	b.Give(60)
	if !b.Take(60) {
		t.Fatal("room given back was not taken")
	}
	b.Give(100)
	var wg sync.WaitGroup
	var mu sync.Mutex
	maxSeen := int64(0)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				if b.Take(30) {
					mu.Lock()
					maxSeen = max(maxSeen, b.Held())
					mu.Unlock()
					b.Give(30)
				}
			}
		}()
	}
	wg.Wait()
	if maxSeen > 100 || b.Held() != 0 {
		t.Fatalf("held up to %d (limit 100), %d at the end", maxSeen, b.Held())
	}
	var none *Budget
	if !none.Take(1<<40) || none.Held() != 0 {
		t.Fatal("a nil budget limits")
	}
}
