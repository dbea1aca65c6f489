package crpc

import (
	"context"
	"sync"
)

// budget is a byte semaphore: acquire takes n whole or waits.
type budget struct {
	mu      sync.Mutex
	free    int64
	size    int64
	waiting int
	peak    int64         // most ever taken (tests)
	wake    chan struct{} // closed and replaced when bytes come back to waiters
}

func newBudget(size int64) *budget { return &budget{free: size, size: size, wake: make(chan struct{})} }

func (b *budget) acquire(ctx context.Context, n int64) error {
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

// tryAcquire takes n if it is free now.
func (b *budget) tryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.free < n {
		return false
	}
	b.free -= n
	b.peak = max(b.peak, b.size-b.free)
	return true
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	b.free += n
	if b.waiting > 0 {
		close(b.wake)
		b.wake = make(chan struct{})
	}
	b.mu.Unlock()
}

// state is the bytes taken, the most ever taken, and the waiters.
func (b *budget) state() (used, peak int64, waiting int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.size - b.free, b.peak, b.waiting
}
