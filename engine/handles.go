package engine

import "sync"

// handles maps opaque 64-bit handles to objects. A handle packs a slot
// index (low 32 bits, plus one so 0 is never valid) and the slot's
// generation (high 32 bits): a freed, stale or forged handle never reaches
// another object, even after its slot is reused.
type handles[T any] struct {
	mu    sync.RWMutex
	slots []*T
	gens  []uint32
	free  []uint32
}

// addLocked stores v and returns its handle.
func (h *handles[T]) addLocked(v *T) uint64 {
	var i uint32
	if n := len(h.free); n > 0 {
		i = h.free[n-1]
		h.free = h.free[:n-1]
	} else {
		i = uint32(len(h.slots))
		h.slots = append(h.slots, nil)
		h.gens = append(h.gens, 0)
	}
	h.gens[i]++
	h.slots[i] = v
	return uint64(h.gens[i])<<32 | uint64(i+1)
}

func (h *handles[T]) get(id uint64) (*T, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.getLocked(id)
}

func (h *handles[T]) getLocked(id uint64) (*T, bool) {
	i, gen := uint32(id)-1, uint32(id>>32)
	if uint32(id) == 0 || int(i) >= len(h.slots) || h.gens[i] != gen || h.slots[i] == nil {
		return nil, false
	}
	return h.slots[i], true
}

// removeLocked frees the slot of a valid handle.
func (h *handles[T]) removeLocked(id uint64) {
	i := uint32(id) - 1
	h.slots[i] = nil
	h.free = append(h.free, i)
}

func (h *handles[T]) remove(id uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.getLocked(id); ok {
		h.removeLocked(id)
	}
}

func (h *handles[T]) all() []*T {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]*T, 0, len(h.slots)-len(h.free))
	for _, v := range h.slots {
		if v != nil {
			out = append(out, v)
		}
	}
	return out
}
