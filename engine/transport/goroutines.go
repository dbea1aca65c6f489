package transport

import "sync"

// Goroutines starts goroutines that a Close must wait for, and refuses
// new ones once Stop has begun, so nothing starts behind the wait. The
// zero value is ready.
type Goroutines struct {
	mu      sync.Mutex // a leaf lock
	stopped bool
	wg      sync.WaitGroup
}

// Go runs f on a goroutine Stop waits for; false (f not run) once Stop
// began.
func (g *Goroutines) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
	return true
}

// Stop refuses new goroutines and waits for the running ones.
func (g *Goroutines) Stop() {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.wg.Wait()
}
