package event

import "sync"

// ring keeps the last published batches for replay. Entries are immutable
// once added, so readers copy entry headers under the lock and write the
// payloads out without it.
type ring struct {
	mu   sync.RWMutex
	ents []ringEntry
	head int
	n    int
}

type ringEntry struct {
	seq  uint64
	wire []byte // the live message: topic, seq and payload frames
	off  int    // payload offset in wire
}

func (e ringEntry) payload() []byte { return e.wire[e.off:] }

func newRing(size int) *ring { return &ring{ents: make([]ringEntry, size)} }

func (r *ring) add(e ringEntry) {
	if len(r.ents) == 0 {
		return
	}
	r.mu.Lock()
	if r.n < len(r.ents) {
		r.ents[(r.head+r.n)%len(r.ents)] = e
		r.n++
	} else {
		r.ents[r.head] = e
		r.head = (r.head + 1) % len(r.ents)
	}
	r.mu.Unlock()
}

// since appends to dst every entry with seq >= start, oldest first.
func (r *ring) since(start uint64, dst []ringEntry) []ringEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	// Seqs increase along the ring: binary search the first >= start.
	lo, hi := 0, r.n
	for lo < hi {
		mid := (lo + hi) / 2
		if r.ents[(r.head+mid)%len(r.ents)].seq < start {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	for i := lo; i < r.n; i++ {
		dst = append(dst, r.ents[(r.head+i)%len(r.ents)])
	}
	return dst
}

// bounds returns the oldest and newest buffered seq.
func (r *ring) bounds() (oldest, newest uint64, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.n == 0 {
		return 0, 0, false
	}
	return r.ents[r.head].seq, r.ents[(r.head+r.n-1)%len(r.ents)].seq, true
}
