package routing

import "math/bits"

// holdTable counts the pending requests holding each (hash, slot) pair of the overlay: an
// open-addressing table like bitTable (linear probing, backward-shift deletion, any size), with
// the whole pair as its key so that two pairs never share a count. It replaces a Go map whose
// per-operation cost dominated Begin and End on long prompts. A zero count marks an empty slot.
// Not safe for concurrent use.
type holdTable struct {
	slots []holdSlot
	n     int
}

type holdSlot struct {
	hash  uint64
	slot  int32
	count int32
}

func (t *holdTable) home(k pendingKey) uint64 {
	hi, _ := bits.Mul64((k.hash^uint64(k.slot)*0xBF58476D1CE4E5B9)*0x9E3779B97F4A7C15, uint64(len(t.slots)))
	return hi
}

func (t *holdTable) next(i uint64) uint64 {
	if i++; i == uint64(len(t.slots)) {
		return 0
	}
	return i
}

func (t *holdTable) dist(i, j uint64) uint64 {
	if j >= i {
		return j - i
	}
	return j + uint64(len(t.slots)) - i
}

// find returns k's slot index, or -1.
func (t *holdTable) find(k pendingKey) int {
	if t.n == 0 {
		return -1
	}
	for i := t.home(k); ; i = t.next(i) {
		s := &t.slots[i]
		if s.count == 0 {
			return -1
		}
		if s.hash == k.hash && s.slot == k.slot {
			return int(i)
		}
	}
}

// get returns k's count, 0 when absent.
func (t *holdTable) get(k pendingKey) int32 {
	if i := t.find(k); i >= 0 {
		return t.slots[i].count
	}
	return 0
}

// set stores k's count; 0 deletes it.
func (t *holdTable) set(k pendingKey, n int32) {
	if i := t.find(k); i >= 0 {
		if n == 0 {
			t.removeAt(uint64(i))
		} else {
			t.slots[i].count = n
		}
		return
	}
	if n == 0 {
		return
	}
	if (t.n+1)*tableMaxLoadDen > len(t.slots)*tableMaxLoadNum {
		t.grow()
	}
	i := t.home(k)
	for t.slots[i].count != 0 {
		i = t.next(i)
	}
	t.slots[i] = holdSlot{k.hash, k.slot, n}
	t.n++
}

func (t *holdTable) removeAt(i uint64) {
	for j := t.next(i); ; j = t.next(j) {
		s := t.slots[j]
		if s.count == 0 {
			break
		}
		if t.dist(t.home(pendingKey{s.hash, s.slot}), j) >= t.dist(i, j) {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = holdSlot{}
	t.n--
}

func (t *holdTable) grow() {
	old := t.slots
	t.slots = make([]holdSlot, max(len(old)*tableGrowNum/tableGrowDen, tableMinSlots))
	t.n = 0
	for _, s := range old {
		if s.count != 0 {
			t.set(pendingKey{s.hash, s.slot}, s.count)
		}
	}
}

// dropSlot deletes every pair of slot and calls f with each hash (one forward pass, as
// bitTable.clearBit).
func (t *holdTable) dropSlot(slot int32, f func(hash uint64)) {
	for i := 0; i < len(t.slots); {
		s := t.slots[i]
		if s.count == 0 || s.slot != slot {
			i++
			continue
		}
		f(s.hash)
		t.removeAt(uint64(i))
	}
}
