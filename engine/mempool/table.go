package mempool

import "github.com/crescent-kv/crescent/internal/offalloc"

// table maps a slab-relative offset to its live allocation: an
// open-addressing hash table with linear probing and backward-shift
// deletion, 16 bytes per slot, at most 3/4 full. It grows by doubling and
// never shrinks, so steady-state inserts do not allocate.
type table struct {
	slots []slot
	shift uint8 // 32 - log2(len(slots))
	count int
}

type slot struct {
	key uint32 // offset/minAlign + 1; 0 marks an empty slot
	n   uint32 // requested length
	h   offalloc.Handle
}

const tableMinSlots = 64

func (t *table) home(key uint32) int { return int((key * 0x9e3779b1) >> t.shift) }

// find returns the slot index holding key, or -1.
func (t *table) find(key uint32) int {
	if len(t.slots) == 0 {
		return -1
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		switch t.slots[i].key {
		case key:
			return i
		case 0:
			return -1
		}
	}
}

// put inserts key, which must not be present.
func (t *table) put(key, n uint32, h offalloc.Handle) {
	if (t.count+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	mask := len(t.slots) - 1
	i := t.home(key)
	for t.slots[i].key != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = slot{key: key, n: n, h: h}
	t.count++
}

// remove empties slot i and shifts later members of its probe run back so
// lookups never stop early.
func (t *table) remove(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].key != 0; j = (j + 1) & mask {
		// Move slot j into the hole at i unless its home lies cyclically
		// in (i, j].
		if h := t.home(t.slots[j].key); (j-h)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
	t.count--
}

func (t *table) grow() {
	old := t.slots
	n := max(tableMinSlots, 2*len(old))
	t.slots = make([]slot, n)
	t.shift = uint8(32 - log2(n))
	t.count = 0
	for _, s := range old {
		if s.key != 0 {
			t.put(s.key, s.n, s.h)
		}
	}
}

func log2(n int) int {
	k := 0
	for 1<<k < n {
		k++
	}
	return k
}
