package routing

// slotTable maps node ids to small dense integers ("slots") so that a set of nodes is a bitset:
// slot s lives in word s/64, bit s%64. Freed slots are reused lowest first, which keeps the number
// of 64-bit words (and so the per-block cost of an estimate) at ceil(live nodes / 64).
// Not safe for concurrent use; the owner's lock guards it.
type slotTable struct {
	byID map[string]int32
	ids  []string // by slot; "" when free
	free []int32  // free slots, kept sorted descending so the lowest is at the end
	gen  uint64   // changes whenever an id gains or loses its slot (idMemo)
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
	t.gen++
	return slot, true
}

// release frees id's slot; the caller has already cleared every bit of it.
func (t *slotTable) release(id string) {
	s, ok := t.byID[id]
	if !ok {
		return
	}
	delete(t.byID, id)
	t.gen++
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

// idMemo remembers, by position, the value looked up for each id of a list, for a table
// generation. Consecutive decisions mostly ask for the same candidates in the same order, so an
// id asked at the same position as last time, with the table unchanged since, keeps its answer
// without a map lookup: comparing ids that share their bytes (the same node list) costs far less
// than hashing them.
type idMemo[V any] struct {
	ids  []string
	vals []V
	gen  uint64
}

// resolve returns the value of each of ids, by look where it is not remembered for gen; gen must
// change whenever look's answer for any id may have.
func (m *idMemo[V]) resolve(ids []string, gen uint64, look func(string) V) []V {
	same := m.gen == gen && len(m.ids) == len(ids)
	if len(m.ids) != len(ids) {
		m.ids, m.vals = grow(m.ids, len(ids)), grow(m.vals, len(ids))
	}
	for i, id := range ids {
		if same && m.ids[i] == id {
			continue
		}
		m.ids[i], m.vals[i] = id, look(id)
	}
	m.gen = gen
	return m.vals
}
