package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A blocking fake batch RPC: each send waits for a release, so tests
// control what is in flight.
type fakeRPC struct {
	mu      sync.Mutex
	batches [][]int
	release chan struct{}
	started chan int
}

func (f *fakeRPC) send(_ context.Context, qs []int) ([]string, []error) {
	f.mu.Lock()
	f.batches = append(f.batches, append([]int(nil), qs...))
	f.mu.Unlock()
	f.started <- len(qs)
	<-f.release
	rs, errs := make([]string, len(qs)), make([]error, len(qs))
	for i, q := range qs {
		if q < 0 {
			errs[i] = fmt.Errorf("bad %d", q)
			continue
		}
		rs[i] = fmt.Sprint("r", q)
	}
	return rs, errs
}

func TestCoalescerBatchesWhileBusy(t *testing.T) {
	f := &fakeRPC{release: make(chan struct{}), started: make(chan int, 16)}
	c := newCoalescer(4, func(a, b int) bool { return (a%2 == 0) == (b%2 == 0) }, f.send)
	c.depth = 1 // one batch in flight: every later call queues
	type out struct {
		q   int
		r   string
		err error
	}
	results := make(chan out, 16)
	call := func(q int) {
		r, err := c.do(context.Background(), q)
		results <- out{q, r, err}
	}
	go call(0) // idle: leaves alone at once
	if n := <-f.started; n != 1 {
		t.Fatalf("first batch of %d", n)
	}
	// While it is in flight, more arrive: evens and odds (not compatible)
	// and more evens than fit in one batch.
	var wg sync.WaitGroup
	for _, q := range []int{2, 4, 6, 8, 10, 1, -2} {
		wg.Add(1)
		go func() { defer wg.Done(); call(q) }()
	}
	// Let them queue before releasing the first RPC.
	waitQueued(t, c, 7)
	close(f.release)
	wg.Wait()
	got := map[int]out{}
	for i := 0; i < 8; i++ {
		o := <-results
		got[o.q] = o
	}
	for _, q := range []int{0, 2, 4, 6, 8, 10, 1} {
		if got[q].err != nil || got[q].r != fmt.Sprint("r", q) {
			t.Fatalf("call %d: %+v", q, got[q])
		}
	}
	if got[-2].err == nil {
		t.Fatal("per-item error lost")
	}
	// Batches never mix parities and never exceed 4.
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.batches) < 3 {
		t.Fatalf("batches %v: queued calls were not merged", f.batches)
	}
	for _, b := range f.batches {
		if len(b) > 4 {
			t.Fatalf("batch %v over the limit", b)
		}
		for _, q := range b[1:] {
			if (q%2 == 0) != (b[0]%2 == 0) {
				t.Fatalf("batch %v mixes incompatible calls", b)
			}
		}
	}
	if c.busy != 0 || len(c.q) != 0 {
		t.Fatal("coalescer not idle at the end")
	}
}

// Two batches go out at once (coalesceDepth): a call that arrives while
// one is in flight leaves at once in a second; only then do calls queue,
// and the first batch to come back takes them.
func TestCoalescerSecondBatchInFlight(t *testing.T) {
	f := &fakeRPC{release: make(chan struct{}), started: make(chan int, 16)}
	c := newCoalescer(8, func(a, b int) bool { return true }, f.send)
	results := make(chan error, 16)
	call := func(q int) {
		_, err := c.do(context.Background(), q)
		results <- err
	}
	go call(1)
	require.Equal(t, 1, <-f.started)
	go call(2)
	select {
	case n := <-f.started:
		require.Equal(t, 1, n, "the second call leaves alone, not behind the first")
	case <-time.After(10 * time.Second):
		t.Fatal("the second call waits for the first batch's answer")
	}
	for q := 3; q <= 5; q++ {
		go call(q)
	}
	waitQueued(t, c, 3)
	f.release <- struct{}{} // one batch answers; its caller hands over
	require.Equal(t, 3, <-f.started, "the queued calls share one batch")
	close(f.release)
	for range 5 {
		require.NoError(t, <-results)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	assert.Zero(t, c.busy)
	assert.Empty(t, c.q)
}

func waitQueued(t *testing.T, c *coalescer[int, string], n int) {
	t.Helper()
	for i := 0; i < 10000; i++ {
		c.mu.Lock()
		l := len(c.q)
		c.mu.Unlock()
		if l >= n {
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Fatalf("fewer than %d calls queued", n)
}

// A batch's RPC outlives the end of any one call riding on it (here its
// leader's) and ends once every call in it has ended; a lone call's RPC
// has the call's context. Before, every RPC ran detached to the RPC
// timeout: a put whose context ended while no master led still waited
// 10 s (TestHAFailover's put with no leader).
func TestCoalescerBatchContext(t *testing.T) {
	type seen struct {
		qs           []int
		early, later error
	}
	got := make(chan seen, 4)
	gate := make(chan struct{})
	out := make(chan struct{}, 1)
	var cancelRider context.CancelFunc
	c := newCoalescer(8, func(a, b int) bool { return true }, func(ctx context.Context, qs []int) ([]string, []error) {
		switch {
		case qs[0] == 0: // holds the coalescer busy
			out <- struct{}{}
			<-gate
		case len(qs) == 1:
			got <- seen{qs: qs, early: ctx.Err()}
		default:
			s := seen{qs: append([]int(nil), qs...)}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			s.early = ctx.Err()
			cancelRider()
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
			}
			s.later = ctx.Err()
			got <- s
		}
		return make([]string, len(qs)), make([]error, len(qs))
	})
	c.depth = 1
	bg := context.Background()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.do(bg, 0) }()
	<-out

	leaderCtx, cancelLeader := context.WithCancel(bg)
	riderCtx, cr := context.WithCancel(bg)
	cancelRider = cr
	wg.Add(2)
	go func() { defer wg.Done(); c.do(leaderCtx, 1) }()
	waitQueued(t, c, 1)
	go func() { defer wg.Done(); c.do(riderCtx, 2) }()
	waitQueued(t, c, 2)
	cancelLeader()
	close(gate)
	s := <-got
	wg.Wait()
	assert.Equal(t, []int{1, 2}, s.qs)
	assert.NoError(t, s.early, "the leader's end failed the rider's call")
	assert.ErrorIs(t, s.later, context.Canceled, "the RPC outlived every call in it")

	ctx, cancel := context.WithCancel(bg)
	cancel()
	_, err := c.do(ctx, 5)
	require.NoError(t, err) // the fake RPC answers regardless
	s = <-got
	assert.Equal(t, []int{5}, s.qs)
	assert.ErrorIs(t, s.early, context.Canceled, "a lone call's RPC has its context")
}
