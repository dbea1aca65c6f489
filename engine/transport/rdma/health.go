package rdma

import (
	"sync"
	"sync/atomic"
	"time"
)

// pairKey names a (local NIC, peer NIC) pair: a rail.
type pairKey struct {
	nic  int
	peer string // peer NIC path
}

type pairHealth struct {
	errs        []time.Time // recent errors, oldest first
	pausedUntil time.Time
}

// health pauses rails after repeated errors: PauseErrors within
// PauseWindow pause a pair for PauseFor; it is used again afterwards.
type health struct {
	mu     sync.Mutex
	pairs  map[pairKey]*pairHealth
	paused atomic.Int64 // pairs whose pause may not have expired yet
	pauses atomic.Uint64

	limit       int
	window, dur time.Duration
}

func newHealth(cfg *Config) *health {
	return &health{pairs: make(map[pairKey]*pairHealth), limit: cfg.PauseErrors, window: cfg.PauseWindow, dur: cfg.PauseFor}
}

// record counts an error on k and reports whether it paused the pair.
func (h *health) record(k pairKey, now time.Time) bool {
	if h.limit <= 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pairs[k]
	if p == nil {
		p = &pairHealth{}
		h.pairs[k] = p
	}
	if now.Before(p.pausedUntil) {
		return false
	}
	cut := 0
	for cut < len(p.errs) && now.Sub(p.errs[cut]) > h.window {
		cut++
	}
	p.errs = append(p.errs[cut:], now)
	if len(p.errs) < h.limit {
		return false
	}
	p.errs = p.errs[:0]
	p.pausedUntil = now.Add(h.dur)
	h.paused.Add(1)
	h.pauses.Add(1)
	return true
}

// isPaused reports whether k is paused at now; an expired pause is
// lifted.
func (h *health) isPaused(k pairKey, now time.Time) bool {
	if h.paused.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pairs[k]
	if p == nil || p.pausedUntil.IsZero() {
		return false
	}
	if now.Before(p.pausedUntil) {
		return true
	}
	p.pausedUntil = time.Time{}
	h.paused.Add(-1)
	return false
}

// pausedNow counts the pairs paused at now.
func (h *health) pausedNow(now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, p := range h.pairs {
		if now.Before(p.pausedUntil) {
			n++
		}
	}
	return n
}
