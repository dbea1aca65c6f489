package oplog

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/store/master"
)

// memStore is a Store in memory keeping the contract of doc.go:
// contiguous seqs (ErrGap), sealed entries, term fencing, fail-stop. gate,
// when set, holds every Append until it can receive; failNext makes the
// next Append fail.
type memStore struct {
	mu       sync.Mutex
	entries  []Entry
	first    uint64 // seq of entries[0]
	term     uint64
	failed   error
	failNext error
	closed   bool
	batches  []int         // size of each Append that succeeded
	gate     chan struct{} // nil: no hold
	entered  chan struct{} // gets a token when an Append starts (if not nil)
	release  func()        // opens gate
}

func newMemStore() *memStore { return &memStore{first: 1} }

func (s *memStore) Append(ctx context.Context, term uint64, es []Entry) error {
	s.mu.Lock()
	gate, entered := s.gate, s.entered
	s.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return ErrClosed
	case s.failed != nil:
		return fmt.Errorf("%w: %w", ErrFailed, s.failed)
	case s.failNext != nil:
		s.failed, s.failNext = s.failNext, nil
		return s.failed
	case term < s.term:
		s.failed = fmt.Errorf("%w: term %d after %d", ErrFenced, term, s.term)
		return s.failed
	}
	next := s.first + uint64(len(s.entries))
	for i := range es {
		if es[i].Seq != next+uint64(i) {
			return fmt.Errorf("%w: seq %d, want %d", ErrGap, es[i].Seq, next+uint64(i))
		}
		if err := es[i].Verify(); err != nil {
			s.failed = err
			return err
		}
	}
	s.term = term
	for _, e := range es {
		e.Payload = append([]byte(nil), e.Payload...)
		s.entries = append(s.entries, e)
	}
	s.batches = append(s.batches, len(es))
	return nil
}

func (s *memStore) Read(_ context.Context, from uint64, max int) ([]Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if from < s.first {
		return nil, fmt.Errorf("%w: seq %d (first %d)", ErrCompacted, from, s.first)
	}
	i := from - s.first
	if i >= uint64(len(s.entries)) {
		return nil, nil
	}
	out := append([]Entry(nil), s.entries[i:min(uint64(len(s.entries)), i+uint64(max))]...)
	for j := range out {
		if err := out[j].Verify(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *memStore) LastSeq(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first + uint64(len(s.entries)) - 1, nil
}

func (s *memStore) FirstSeq(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first, nil
}

func (s *memStore) Compact(_ context.Context, before uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if before <= s.first {
		return nil
	}
	n := min(before-s.first, uint64(len(s.entries)))
	s.entries = s.entries[n:]
	s.first += n
	return nil
}

func (s *memStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func (s *memStore) all(t *testing.T) []Entry {
	t.Helper()
	es, err := s.Read(context.Background(), s.first, 1<<30)
	require.NoError(t, err)
	return es
}

func (s *memStore) hold() (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = make(chan struct{})
	s.entered = make(chan struct{}, 1024)
	g := s.gate
	var once sync.Once
	release = func() { once.Do(func() { close(g) }) }
	s.release = release
	return release
}

// TestMemStore checks the test store itself keeps the contract.
func TestMemStore(t *testing.T) {
	ctx := context.Background()
	s := newMemStore()
	e := func(seq uint64) Entry {
		x := Entry{Seq: seq, Kind: uint8(master.OpRemove), Key: fmt.Sprint("k", seq)}
		x.Seal()
		return x
	}
	require.NoError(t, s.Append(ctx, 1, []Entry{e(1), e(2)}))
	require.ErrorIs(t, s.Append(ctx, 1, []Entry{e(4)}), ErrGap)
	bad := e(3)
	bad.Key = "x"
	require.ErrorIs(t, s.Append(ctx, 1, []Entry{bad}), ErrCorrupt)
	require.ErrorIs(t, s.Append(ctx, 1, []Entry{e(3)}), ErrFailed)
	last, _ := s.LastSeq(ctx)
	require.Equal(t, uint64(2), last)
}

// sinkTestCtx bounds a wait so that a broken sink fails the test instead of
// hanging it.
func sinkTestCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func sinkOp(i int) *master.Op {
	return &master.Op{Kind: master.OpPutStart, Time: int64(i), Key: fmt.Sprintf("key-%d", i),
		Client: master.UUID{Hi: 1, Lo: uint64(i)}, Size: 100, Segments: []uint32{0}, Addrs: []uint64{uint64(i) << 12}, Gen: uint64(i + 1)}
}

func newSinkForTest(t *testing.T, st Store, cfg SinkConfig) *Sink {
	t.Helper()
	s, err := NewSink(context.Background(), st, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		if ms, ok := st.(*memStore); ok { // a failed test leaves no Append held
			ms.mu.Lock()
			release := ms.release
			ms.mu.Unlock()
			if release != nil {
				release()
			}
		}
		s.Close()
	})
	return s
}

// TestSinkGroupCommit: ops queued while the store writes go to it in one
// Append, numbered from 1 with no gap, and decode to what was appended.
func TestSinkGroupCommit(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := sinkTestCtx(t)
	st := newMemStore()
	release := st.hold()
	s := newSinkForTest(t, st, SinkConfig{Term: 7})
	s.Append(sinkOp(0))
	<-st.entered // the first Append is under way with one entry
	for i := 1; i < 50; i++ {
		s.Append(sinkOp(i))
	}
	require.Equal(t, uint64(50), s.Appended())
	require.Equal(t, uint64(0), s.Durable())
	release()
	require.NoError(t, s.WaitDurable(ctx, 50))
	require.Equal(t, uint64(50), s.Durable())
	require.NoError(t, s.Close())
	require.Equal(t, []int{1, 49}, st.batches)
	es := st.all(t)
	require.Len(t, es, 50)
	for i, e := range es {
		require.Equal(t, uint64(i+1), e.Seq)
		require.Equal(t, uint64(7), e.Term)
		require.NoError(t, e.Verify())
		op, err := DecodeOp(&e)
		require.NoError(t, err)
		require.Equal(t, sinkOp(i), op)
	}
}

// TestSinkContinuesLog: a sink on a store that holds entries numbers
// after them.
func TestSinkContinuesLog(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := sinkTestCtx(t)
	st := newMemStore()
	s := newSinkForTest(t, st, SinkConfig{})
	for i := range 3 {
		s.Append(sinkOp(i))
	}
	require.NoError(t, s.Close())
	s = newSinkForTest(t, st, SinkConfig{})
	require.Equal(t, uint64(3), s.Appended())
	require.Equal(t, uint64(3), s.Durable())
	require.NoError(t, s.WaitDurable(ctx, 3))
	s.Append(sinkOp(3))
	require.NoError(t, s.WaitDurable(ctx, 4))
	require.NoError(t, s.Close())
	require.Len(t, st.all(t), 4)
}

// TestSinkFailStop: once Store.Append fails, the sink is failed: seqs
// durable before stay durable, later ones return the error, new ops are
// dropped.
func TestSinkFailStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := sinkTestCtx(t)
	st := newMemStore()
	s := newSinkForTest(t, st, SinkConfig{})
	s.Append(sinkOp(0))
	require.NoError(t, s.WaitDurable(ctx, 1))
	boom := errors.New("disk on fire")
	st.mu.Lock()
	st.failNext = boom
	st.mu.Unlock()
	s.Append(sinkOp(1))
	require.ErrorIs(t, s.WaitDurable(ctx, 2), boom)
	require.ErrorIs(t, s.Failed(), boom)
	require.NoError(t, s.WaitDurable(ctx, 1))
	s.Append(sinkOp(2))
	require.Equal(t, uint64(3), s.Appended(), "a dropped op is numbered")
	require.ErrorIs(t, s.WaitDurable(ctx, 3), boom)
	require.Equal(t, uint64(1), s.Durable())
	require.ErrorIs(t, s.Close(), boom)
	require.Len(t, st.all(t), 1)
}

// TestSinkNoAckAfterFailure: a handler's pattern (call the master, then
// wait for Appended()) gets an error for an op the sink dropped, never nil
// because the seq before it is durable: after an op that does not
// encode, after a full queue, after Close.
func TestSinkNoAckAfterFailure(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := sinkTestCtx(t)
	for _, tc := range []struct {
		name string
		fail func(t *testing.T, s *Sink, st *memStore)
		want error
	}{
		{"bad op", func(_ *testing.T, s *Sink, _ *memStore) { s.Append(&master.Op{Kind: 200}) }, ErrBadOp},
		{"queue full", func(t *testing.T, s *Sink, st *memStore) {
			release := st.hold()
			s.Append(sinkOp(1)) // being written, holds the one place
			s.Append(sinkOp(2)) // waits, then fails
			release()
			// The one being written still lands (WaitDurable would
			// already report the failure for it).
			require.Eventually(t, func() bool { return s.Durable() == 2 }, time.Minute, time.Millisecond)
		}, ErrQueueFull},
		{"closed", func(t *testing.T, s *Sink, _ *memStore) {
			require.NoError(t, s.Close())
			s.Append(sinkOp(1))
		}, ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newMemStore()
			s := newSinkForTest(t, st, SinkConfig{Queue: 1, FullDelay: 20 * time.Millisecond})
			s.Append(sinkOp(0))
			require.NoError(t, s.WaitDurable(ctx, s.Appended()))
			tc.fail(t, s, st)
			require.ErrorIs(t, s.WaitDurable(ctx, s.Appended()), tc.want)
			s.Append(sinkOp(3)) // dropped too
			require.ErrorIs(t, s.WaitDurable(ctx, s.Appended()), tc.want)
			st.mu.Lock()
			release := st.release
			st.mu.Unlock()
			if release != nil {
				release()
			}
			s.Close()
			require.Equal(t, s.Durable(), uint64(len(st.all(t))), "only durable seqs are in the store")
		})
	}
}

// TestSinkBadOp: an op that does not encode fails the sink (the master
// applied it; the log cannot hold it).
func TestSinkBadOp(t *testing.T) {
	defer goleak.VerifyNone(t)
	st := newMemStore()
	s := newSinkForTest(t, st, SinkConfig{})
	s.Append(&master.Op{Kind: 200})
	require.ErrorIs(t, s.Failed(), ErrBadOp)
	require.Equal(t, uint64(1), s.Appended())
	require.ErrorIs(t, s.WaitDurable(sinkTestCtx(t), 1), ErrBadOp)
	require.ErrorIs(t, s.Close(), ErrBadOp)
}

// TestSinkQueueFullFails: with the store stuck and the queue full, Append
// waits FullDelay, then the sink fails with ErrQueueFull.
func TestSinkQueueFullFails(t *testing.T) {
	defer goleak.VerifyNone(t)
	st := newMemStore()
	release := st.hold()
	s := newSinkForTest(t, st, SinkConfig{Queue: 4, FullDelay: 20 * time.Millisecond})
	for i := range 4 {
		s.Append(sinkOp(i))
	}
	require.NoError(t, s.Failed())
	s.Append(sinkOp(4)) // waits, then fails
	require.ErrorIs(t, s.Failed(), ErrQueueFull)
	require.Equal(t, uint64(5), s.Appended())
	require.ErrorIs(t, s.WaitDurable(sinkTestCtx(t), 5), ErrQueueFull)
	require.ErrorIs(t, s.WaitDurable(sinkTestCtx(t), 1), ErrQueueFull)
	release()
	require.ErrorIs(t, s.Close(), ErrQueueFull)
}

// TestSinkQueueFullWaits: an Append waiting for room goes in once the
// store catches up.
func TestSinkQueueFullWaits(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := sinkTestCtx(t)
	st := newMemStore()
	release := st.hold()
	s := newSinkForTest(t, st, SinkConfig{Queue: 4, FullDelay: time.Hour})
	for i := range 4 {
		s.Append(sinkOp(i))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Append(sinkOp(4))
	}()
	release()
	<-done
	require.NoError(t, s.WaitDurable(ctx, 5))
	require.NoError(t, s.Close())
	require.Len(t, st.all(t), 5)
}

// TestSinkByteBound: the byte bound holds too (one entry always fits).
func TestSinkByteBound(t *testing.T) {
	defer goleak.VerifyNone(t)
	st := newMemStore()
	release := st.hold()
	s := newSinkForTest(t, st, SinkConfig{Bytes: 10, FullDelay: 20 * time.Millisecond})
	s.Append(sinkOp(0)) // bigger than 10 bytes, alone: in
	require.NoError(t, s.Failed())
	s.Append(sinkOp(1))
	require.ErrorIs(t, s.Failed(), ErrQueueFull)
	release()
	require.ErrorIs(t, s.Close(), ErrQueueFull)
}

// TestSinkWaitDurableContext: a waiter gives up with its context.
func TestSinkWaitDurableContext(t *testing.T) {
	defer goleak.VerifyNone(t)
	st := newMemStore()
	release := st.hold()
	s := newSinkForTest(t, st, SinkConfig{})
	s.Append(sinkOp(0))
	ctx, cancel := context.WithCancel(sinkTestCtx(t))
	cancel()
	require.ErrorIs(t, s.WaitDurable(ctx, 1), context.Canceled)
	release()
	require.NoError(t, s.WaitDurable(sinkTestCtx(t), 1))
	require.NoError(t, s.Close())
	// After Close nothing is written: a later op's seq is an error.
	s.Append(sinkOp(1))
	require.Equal(t, uint64(2), s.Appended())
	require.ErrorIs(t, s.WaitDurable(sinkTestCtx(t), 2), ErrClosed)
	require.Len(t, st.all(t), 1)
}

// TestSinkConcurrent: ops from many goroutines (shards) end up contiguous
// and all durable; MaxBatch bounds each Append.
func TestSinkConcurrent(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := sinkTestCtx(t)
	st := newMemStore()
	s := newSinkForTest(t, st, SinkConfig{MaxBatch: 7, Queue: 16})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				s.Append(sinkOp(g*1000 + i))
				if i%50 == 0 {
					if err := s.WaitDurable(ctx, s.Appended()); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, s.WaitDurable(ctx, 1600))
	require.NoError(t, s.Close())
	es := st.all(t)
	require.Len(t, es, 1600)
	seen := map[string]bool{}
	for i, e := range es {
		require.Equal(t, uint64(i+1), e.Seq)
		seen[e.Key] = true
	}
	require.Len(t, seen, 1600)
	for _, n := range st.batches {
		require.LessOrEqual(t, n, 7)
	}
}

// TestSinkWakesOnlyDurableWaiters: a commit wakes the waiters of the
// seqs it made durable and leaves the others asleep; a waiter that gives
// up with its context is forgotten.
func TestSinkWakesOnlyDurableWaiters(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := newSinkForTest(t, newMemStore(), SinkConfig{})
	waiters := func() []uint64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		var out []uint64
		for _, w := range s.waiters {
			out = append(out, w.seq)
		}
		return out
	}
	far, near := make(chan error, 1), make(chan error, 1)
	go func() { far <- s.WaitDurable(sinkTestCtx(t), 3) }()
	go func() { near <- s.WaitDurable(sinkTestCtx(t), 1) }()
	require.Eventually(t, func() bool { return len(waiters()) == 2 }, 10*time.Second, time.Millisecond)
	require.Equal(t, []uint64{1, 3}, waiters(), "kept by seq")
	s.Append(sinkOp(0))
	require.NoError(t, <-near)
	require.Equal(t, []uint64{3}, waiters(), "seq 3 is not durable: its waiter sleeps on")
	s.Append(sinkOp(1))
	s.Append(sinkOp(2))
	require.NoError(t, <-far)

	ctx, cancel := context.WithCancel(sinkTestCtx(t))
	gone := make(chan error, 1)
	go func() { gone <- s.WaitDurable(ctx, 10) }()
	require.Eventually(t, func() bool { return len(waiters()) == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-gone, context.Canceled)
	require.Empty(t, waiters())
	require.NoError(t, s.Close())
}

// TestSinkWakesWaitersInTurn: a commit wakes only the first of the
// waiters it made durable; each woken waiter wakes the next, so every
// one of them is answered, also when one gives up with its context as
// it is woken.
func TestSinkWakesWaitersInTurn(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := newSinkForTest(t, newMemStore(), SinkConfig{})
	chans := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	s.mu.Lock()
	s.waiters = []waiter{{1, chans[0]}, {2, chans[1]}, {5, chans[2]}}
	s.durable.Store(2)
	s.wakeNext()
	open := func(c chan struct{}) bool {
		select {
		case <-c:
			return false
		default:
			return true
		}
	}
	require.False(t, open(chans[0]), "the first durable waiter is woken")
	require.True(t, open(chans[1]), "the next waits for the first to run")
	require.Len(t, s.waiters, 2)
	s.wakeNext()
	require.False(t, open(chans[1]))
	s.wakeNext()
	require.True(t, open(chans[2]), "seq 5 is not durable")
	s.waiters = nil
	s.durable.Store(0)
	s.mu.Unlock()
	require.NoError(t, s.Close())

	// A waiter woken as its context ends may take either branch; the
	// next must be woken all the same. (Seqs made durable by hand: the
	// sink writes nothing here.)
	s = newSinkForTest(t, newMemStore(), SinkConfig{})
	ctx := sinkTestCtx(t)
	for range 50 {
		first, cancel := context.WithCancel(ctx)
		errs := make(chan error, 2)
		go func() { errs <- s.WaitDurable(first, 1) }()
		go func() { errs <- s.WaitDurable(ctx, 2) }()
		require.Eventually(t, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.waiters) == 2
		}, 10*time.Second, time.Millisecond)
		s.mu.Lock()
		cancel()
		s.durable.Store(2)
		s.wakeNext()
		s.mu.Unlock()
		for range 2 {
			select {
			case err := <-errs:
				if err != nil {
					require.ErrorIs(t, err, context.Canceled)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a durable waiter was never woken")
			}
		}
		s.durable.Store(0)
	}
	require.NoError(t, s.Close())
}

// TestSinkLocalRecordsIntact: the records the sink encodes and the
// arrays it takes them in (reused from batch to batch, split when a
// batch is bounded) reach a Local log whole: every op reads back, in
// order, as it was appended, whatever the syncers and the batch bound.
func TestSinkLocalRecordsIntact(t *testing.T) {
	for _, c := range []struct{ syncers, maxBatch int }{{1, 0}, {2, 0}, {1, 7}, {3, 5}} {
		t.Run(fmt.Sprintf("syncers=%d,max_batch=%d", c.syncers, c.maxBatch), func(t *testing.T) {
			defer goleak.VerifyNone(t)
			ctx := sinkTestCtx(t)
			l, err := OpenLocal(t.TempDir(), LocalOptions{Syncers: c.syncers})
			require.NoError(t, err)
			defer l.Close()
			s := newSinkForTest(t, l, SinkConfig{Term: 1, MaxBatch: c.maxBatch})
			const producers, rounds = 4, 40
			var (
				mu  sync.Mutex
				ops = map[string]*master.Op{}
				wg  sync.WaitGroup
			)
			for p := range producers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := range rounds {
						for j := range 1 + (p*7+r)%13 { // bursts of 1 to 13
							op := sinkOp(p*100000 + r*100 + j)
							op.Key += string(make([]byte, (r*31+j)%200)) // records of many sizes
							mu.Lock()
							ops[op.Key] = op
							mu.Unlock()
							s.Append(op)
						}
						if err := s.WaitDurable(ctx, s.Appended()); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			require.NoError(t, s.Close())
			es, err := l.Read(ctx, 1, len(ops)+1)
			require.NoError(t, err)
			require.Len(t, es, len(ops))
			for i := range es {
				require.Equal(t, uint64(i+1), es[i].Seq)
				got, err := DecodeOp(&es[i])
				require.NoError(t, err)
				want := ops[es[i].Key]
				require.NotNil(t, want, "seq %d: a key nobody appended", es[i].Seq)
				require.Equal(t, want.Addrs, got.Addrs)
				require.Equal(t, want.Gen, got.Gen)
				delete(ops, es[i].Key)
			}
			require.Empty(t, ops)
		})
	}
}

// watchedLocal is a Local that records, for each batch the sink hands
// it, whether a WaitDurable caller wrote it, and how many batches were
// between startAppend and the end of their wait at once.
type watchedLocal struct {
	*Local
	inline, batches atomic.Int64
	in, most        atomic.Int64
}

func (w *watchedLocal) startAppend(term uint64, entries []Entry, recs []byte, offs []int) func() error {
	w.batches.Add(1)
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, ".(*Sink).WaitDurable") {
			w.inline.Add(1)
			break
		}
		if !more {
			break
		}
	}
	n := w.in.Add(1)
	for m := w.most.Load(); n > m && !w.most.CompareAndSwap(m, n); m = w.most.Load() {
	}
	wait := w.Local.startAppend(term, entries, recs, offs)
	return func() error {
		defer w.in.Add(-1)
		return wait()
	}
}

// TestSinkWaiterWritesItself: on a log that writes on its caller's
// goroutine, a handler waiting for its op writes the queue itself when
// no writer is busy, instead of waking the sink's writer and being woken
// by it; and however many handlers do, no more batches are in the log at
// once than it has syncers.
func TestSinkWaiterWritesItself(t *testing.T) {
	for _, syncers := range []int{1, 3} {
		t.Run(fmt.Sprintf("syncers=%d", syncers), func(t *testing.T) {
			defer goleak.VerifyNone(t)
			ctx := sinkTestCtx(t)
			l, err := OpenLocal(t.TempDir(), LocalOptions{Syncers: syncers})
			require.NoError(t, err)
			defer l.Close()
			w := &watchedLocal{Local: l}
			s := newSinkForTest(t, w, SinkConfig{Term: 1})
			// No batch started by the linger timer while this goroutine
			// is descheduled between Append and WaitDurable.
			s.lingerFor = time.Hour

			// One op at a time: each is written by its waiter.
			for i := range 20 {
				s.Append(sinkOp(i))
				require.NoError(t, s.WaitDurable(ctx, s.Appended()))
			}
			require.Equal(t, int64(20), w.batches.Load())
			require.Equal(t, int64(20), w.inline.Load(), "batches written by their waiters")

			// Many at once: all durable, in order, within the bound.
			var wg sync.WaitGroup
			for p := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := range 30 {
						s.Append(sinkOp(1000 + p*100 + r))
						if err := s.WaitDurable(ctx, s.Appended()); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			require.NoError(t, s.Close())
			require.LessOrEqual(t, w.most.Load(), int64(syncers), "batches in the log at once")
			es, err := l.Read(ctx, 1, 20+8*30+1)
			require.NoError(t, err)
			require.Len(t, es, 20+8*30)
			for i := range es {
				require.Equal(t, uint64(i+1), es[i].Seq)
			}
		})
	}
}
