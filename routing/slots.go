package routing

// slotTable maps node ids to small dense integers ("slots") so that a set of nodes is a bitset:
// slot s lives in word s/64, bit s%64. Freed slots are reused lowest first, which keeps the number
// of 64-bit words (and so the per-block cost of an estimate) at ceil(live nodes / 64).
// Not safe for concurrent use; the owner's lock guards it.
type slotTable struct {
	byID map[string]int32
	ids  []string // by slot; "" when free
	free []int32  // free slots, kept sorted descending so the lowest is at the end
}

func newSlotTable() slotTable {
	return slotTable{byID: make(map[string]int32)}
}

func (t *slotTable) lookup(id string) (int32, bool) {
	s, ok := t.byID[id]
	return s, ok
}

// acquire returns id's slot, allocating the lowest free one if id has none.
func (t *slotTable) acquire(id string) (slot int32, created bool) {
	if s, ok := t.byID[id]; ok {
		return s, false
	}
	if n := len(t.free); n > 0 {
		slot = t.free[n-1]
		t.free = t.free[:n-1]
		t.ids[slot] = id
	} else {
		slot = int32(len(t.ids))
		t.ids = append(t.ids, id)
	}
	t.byID[id] = slot
	return slot, true
}

// release frees id's slot; the caller has already cleared every bit of it.
func (t *slotTable) release(id string) {
	s, ok := t.byID[id]
	if !ok {
		return
	}
	delete(t.byID, id)
	t.ids[s] = ""
	// Insert keeping descending order (the free list is at most the number of removed nodes).
	i := len(t.free)
	t.free = append(t.free, s)
	for i > 0 && t.free[i-1] < s {
		t.free[i] = t.free[i-1]
		i--
	}
	t.free[i] = s
	// Trim trailing free slots so words() shrinks after nodes leave.
	for len(t.ids) > 0 && t.ids[len(t.ids)-1] == "" && len(t.free) > 0 && t.free[0] == int32(len(t.ids)-1) {
		t.ids = t.ids[:len(t.ids)-1]
		t.free = t.free[1:]
	}
}

// words is the number of 64-bit words a bitset over all slots needs.
func (t *slotTable) words() int { return (len(t.ids) + 63) / 64 }
