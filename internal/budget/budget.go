package budget

import (
	"context"
	"sync"
)

// Budget is a byte semaphore: Acquire takes n whole or waits.
type Budget struct {
	mu      sync.Mutex
	free    int64
	size    int64
	waiting int
	peak    int64         // most ever taken
	wake    chan struct{} // closed and replaced when bytes come back to waiters
}

// New returns a Budget of size bytes, all free.
func New(size int64) *Budget { return &Budget{free: size, size: size, wake: make(chan struct{})} }

// Acquire takes n bytes, waiting until they are free or ctx ends.
func (b *Budget) Acquire(ctx context.Context, n int64) error {
	b.mu.Lock()
	for b.free < n {
		b.waiting++
		w := b.wake
		b.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			b.mu.Lock()
			b.waiting--
			b.mu.Unlock()
			return ctx.Err()
		}
		b.mu.Lock()
		b.waiting--
	}
	b.free -= n
	b.peak = max(b.peak, b.size-b.free)
	b.mu.Unlock()
	return nil
}

// TryAcquire takes n if it is free now.
func (b *Budget) TryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.free < n {
		return false
	}
	b.free -= n
	b.peak = max(b.peak, b.size-b.free)
	return true
}

// Release gives n bytes back, waking the waiters (if any).
func (b *Budget) Release(n int64) {
	b.mu.Lock()
	b.free += n
	if b.waiting > 0 {
		close(b.wake)
		b.wake = make(chan struct{})
	}
	b.mu.Unlock()
}

// State is the bytes taken, the most ever taken, and the waiters.
func (b *Budget) State() (used, peak int64, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.size - b.free, b.peak, b.waiting
}
