package oplog

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/store/master"
)

// Sink defaults.
const (
	DefaultSinkQueue     = 1 << 16  // entries queued or being written
	DefaultSinkBytes     = 64 << 20 // their payload and key bytes
	DefaultSinkFullDelay = 5 * time.Second
	// sinkLinger is how long an op nobody waits for may stay queued
	// before the writer starts anyway.
	sinkLinger = time.Millisecond
	// sinkKickAt starts the writer without a waiter once this many
	// entries are queued.
	sinkKickAt = 4096
)

// ErrQueueFull is the failure of a Sink whose queue stayed full for
// SinkConfig.FullDelay: the store takes far longer than the master
// produces, and holding the master's locks longer would stall every
// reader of the keys involved.
var ErrQueueFull = errors.New("oplog: sink queue full")

// SinkConfig configures a Sink.
type SinkConfig struct {
	Term uint64 // written with every Append
	// Queue and Bytes bound what is queued or being written (entries, and
	// their bytes: key and payload twice, in the entry and in its
	// encoded record, plus 72 per entry); 0 = the defaults.
	Queue int
	Bytes int
	// FullDelay is how long Append waits for room in a full queue before
	// the sink fails (ErrQueueFull); 0 = DefaultSinkFullDelay.
	FullDelay time.Duration
	// MaxBatch bounds the entries of one Store.Append; 0 = all queued.
	MaxBatch int
}

// Sink is a master.OpSink that logs every op to a Store: Append numbers
// the op (the next seq), encodes and seals it and queues it; one
// goroutine hands all that is queued to Store.Append at once (group
// commit). WaitDurable tells an RPC handler when its op is durable.
//
// Append blocks only when the queue is full, for at most FullDelay; then,
// as after any Store error or an op that does not encode, the sink is
// failed (fail-stop): nothing more is written, later ops still get a seq
// but are dropped, and WaitDurable returns the error for every seq not
// yet durable.
type Sink struct {
	store Store
	cfg   SinkConfig

	mu    sync.Mutex
	queue []Entry // numbered, not yet handed to the store
	// recs holds the queued entries' records back to back, in the local
	// log's format, queue[i]'s from recOffs[i]: Append seals and encodes
	// each in one pass where it only sealed it before, so a local log's
	// writer takes them as they are (encoding a batch there sat on every
	// commit's path).
	recs    []byte
	recOffs []int
	// spare is a written batch's queue, records and offsets, for the
	// queue to start again in: allocating them anew for every batch
	// cost more than the encoding it saved.
	spare   *queued
	held    int    // entries queued or being written
	bytes   int    // their bytes (key, payload, record)
	next    uint64 // the seq the next op gets
	failed  error
	closed  bool
	changed chan struct{} // closed and replaced when room changes, on failure and close
	kick    chan struct{} // cap 1: start writing
	linger  *time.Timer   // kicks lingerFor after the queue stopped being empty
	// lingerFor is sinkLinger; a test that must see who writes a batch
	// sets it longer than any scheduling delay.
	lingerFor time.Duration
	// waiters are WaitDurable's, by seq: a commit wakes only those it
	// made durable (waking every handler for every commit costs CPU the
	// puts need); a failure or the end of Close wakes all.
	waiters []waiter

	// turn orders the writers: a batch is taken from the queue and
	// handed to the store under it, so batches reach the store in seq
	// order while the one before may still be syncing.
	turn sync.Mutex
	// slots holds a token per batch being written (cap: the store's
	// syncers).
	slots chan struct{}
	// pa is the store when it writes on the caller's goroutine: then a
	// handler in WaitDurable writes the queue itself when a slot is free,
	// instead of waking a writer and being woken by it (two hand-offs that
	// each wait for a core behind the clients' copies on a busy master).
	pa pipelinedAppender

	appended atomic.Uint64
	durable  atomic.Uint64
	done     chan struct{}

	// lastOn[slot(key)] is the seq of the last op on a key of that slot
	// (stored under mu, so it only grows): what a read of the key may
	// have seen and must wait for (LastChange). Keys share slots, which
	// costs a read at most a wait for another key's commit.
	lastOn *[changeSlots]atomic.Uint64
	seed   maphash.Seed

	// Group commits by entries, in BatchBounds's buckets; errors are
	// failed Store.Appends.
	batchBuckets      [len(BatchBounds) + 1]atomic.Uint64
	batches, batchSum atomic.Uint64
	failures          atomic.Uint64
}

// BatchBounds are the upper bounds (entries) of SinkStats.BatchBuckets;
// the last bucket counts the rest.
var BatchBounds = [...]uint64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384}

// SinkStats are a sink's cumulative counters, for metrics.
type SinkStats struct {
	Appended, Durable uint64 // seqs
	Batches           uint64 // Store.Appends (group commits)
	BatchEntries      uint64 // entries they carried
	BatchBuckets      [len(BatchBounds) + 1]uint64
	Errors            uint64 // Store.Appends that failed
	Failed            bool
}

// Stats returns the counters.
func (s *Sink) Stats() SinkStats {
	st := SinkStats{Appended: s.Appended(), Durable: s.Durable(), Batches: s.batches.Load(),
		BatchEntries: s.batchSum.Load(), Errors: s.failures.Load(), Failed: s.Failed() != nil}
	for i := range st.BatchBuckets {
		st.BatchBuckets[i] = s.batchBuckets[i].Load()
	}
	return st
}

// NewSink returns a Sink writing after the store's last seq.
func NewSink(ctx context.Context, st Store, cfg SinkConfig) (*Sink, error) {
	last, err := st.LastSeq(ctx)
	if err != nil {
		return nil, fmt.Errorf("oplog: sink: last seq: %w", err)
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultSinkQueue
	}
	if cfg.Bytes <= 0 {
		cfg.Bytes = DefaultSinkBytes
	}
	if cfg.FullDelay <= 0 {
		cfg.FullDelay = DefaultSinkFullDelay
	}
	s := &Sink{store: st, cfg: cfg, next: last + 1, changed: make(chan struct{}),
		kick: make(chan struct{}, 1), done: make(chan struct{}),
		lastOn: new([changeSlots]atomic.Uint64), seed: maphash.MakeSeed(), lingerFor: sinkLinger}
	s.appended.Store(last)
	s.durable.Store(last)
	s.linger = time.AfterFunc(time.Hour, func() {
		s.mu.Lock()
		s.kickLocked()
		s.mu.Unlock()
	})
	s.linger.Stop()
	n := 1
	if pa, ok := st.(pipelinedAppender); ok {
		n, s.pa = pa.syncers(), pa
	}
	s.slots = make(chan struct{}, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.run()
		}()
	}
	go func() {
		wg.Wait()
		close(s.done)
	}()
	return s, nil
}

// kickLocked starts the writer. s.mu is held (kick is closed under it).
func (s *Sink) kickLocked() {
	if s.closed {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Append implements master.OpSink.
func (s *Sink) Append(op *master.Op) {
	e, err := FromOp(op)
	size := entryBytes(&e)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil || s.closed {
		s.drop()
		return
	}
	if err != nil {
		s.fail(fmt.Errorf("oplog: sink: op seq %d: %w", s.next, err))
		s.drop()
		return
	}
	var deadline *time.Timer
	for s.held >= s.cfg.Queue || s.held > 0 && s.bytes+size > s.cfg.Bytes {
		if deadline == nil {
			deadline = time.NewTimer(s.cfg.FullDelay)
			defer deadline.Stop()
		}
		s.kickLocked()
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
			s.mu.Lock()
		case <-deadline.C:
			s.mu.Lock()
			if s.failed == nil {
				s.fail(fmt.Errorf("%w: %d entries, %d bytes for %v", ErrQueueFull, s.held, s.bytes, s.cfg.FullDelay))
			}
		}
		if s.failed != nil || s.closed {
			s.drop()
			return
		}
	}
	e.Seq, e.Term = s.next, s.cfg.Term
	s.recOffs = append(s.recOffs, len(s.recs))
	s.recs = appendSealedRecord(s.recs, &e)
	s.next++
	s.queue = append(s.queue, e)
	s.held++
	s.bytes += size
	s.appended.Store(e.Seq)
	if op.Key != "" {
		s.lastOn[s.slot(op.Key)].Store(e.Seq)
	}
	// The writer starts when a handler waits (WaitDurable), so the ops
	// of one RPC, appended before it waits, share one commit instead of
	// straddling two (two fsyncs on the RPC's path); an op nobody waits
	// for is written after sinkLinger.
	switch len(s.queue) {
	case 1:
		s.linger.Reset(s.lingerFor)
	case sinkKickAt:
		s.kickLocked()
	}
}

// drop numbers an op that is not written (the sink failed or closed): a
// handler waiting for Appended() then gets the failure, never a nil for
// an earlier, durable seq. s.mu is held.
func (s *Sink) drop() {
	s.appended.Store(s.next)
	s.next++
}

// fail records the first failure. s.mu is held.
func (s *Sink) fail(err error) {
	if s.failed == nil {
		s.failed = err
	}
	for i := range s.queue { // dropped, never written
		s.bytes -= entryBytes(&s.queue[i])
	}
	s.held -= len(s.queue)
	s.queue, s.recs, s.recOffs = nil, nil, nil
	s.broadcast()
}

func (s *Sink) broadcast() {
	close(s.changed)
	s.changed = make(chan struct{})
	if s.failed != nil || s.closed && s.held == 0 {
		s.wakeUpTo(^uint64(0))
	}
}

type waiter struct {
	seq uint64
	ch  chan struct{}
}

// wakeUpTo wakes the waiters for seqs up to seq. s.mu is held.
func (s *Sink) wakeUpTo(seq uint64) {
	n := sort.Search(len(s.waiters), func(i int) bool { return s.waiters[i].seq > seq })
	for _, w := range s.waiters[:n] {
		close(w.ch)
	}
	s.waiters = append(s.waiters[:0], s.waiters[n:]...)
}

// wakeNext wakes the first waiter if its seq is durable; that waiter
// wakes the next one when it runs (WaitDurable). Waking them one after
// the other puts each in its core's next-to-run slot: woken all at once,
// all but the last would queue behind every goroutine already runnable
// there (on a loaded master, the clients' copies), each adding the wait
// to its answer. s.mu is held.
func (s *Sink) wakeNext() {
	if len(s.waiters) > 0 && s.waiters[0].seq <= s.durable.Load() {
		close(s.waiters[0].ch)
		s.waiters = append(s.waiters[:0], s.waiters[1:]...)
	}
}

// pipelinedAppender is a store that writes on the caller's goroutine
// and lets the next batch be written while this one syncs (Local): the
// sink then runs syncers() writers, each doing its batch's fdatasync
// itself.
type pipelinedAppender interface {
	syncers() int
	// startAppend writes entries after everything handed to it before;
	// wait returns once they are durable (and every earlier batch is).
	// recs are the entries' sealed records back to back
	// (appendSealedRecord), entries[i]'s from offs[i].
	startAppend(term uint64, entries []Entry, recs []byte, offs []int) (wait func() error)
}

// run is one writer: it writes what is queued, a batch at a time, until
// Close. With a pipelinedAppender several run; a batch is handed to the
// store under turn, and its wait (its fdatasync) runs after turn is
// released, so another writer takes the next batch meanwhile.
func (s *Sink) run() {
	for open := true; open; {
		_, open = <-s.kick // closed by Close: write what is left, stop
		for {
			switch s.writeBatch(true) {
			case batchStop:
				return
			case batchWritten:
				continue
			}
			break
		}
	}
}

// What writeBatch did.
const (
	batchWritten = iota
	batchEmpty   // nothing queued, or the sink failed
	batchStop    // closed and nothing queued
	batchBusy    // not waiting: every writer's slot or the turn was taken
)

// writeBatch writes one batch of what is queued and publishes it. A
// writer holds one of s.slots for the whole batch, so no more batches
// are in the store at once than it has syncers, whether run or an
// inline caller (WaitDurable) writes them; with wait false it gives up
// rather than wait for a slot or the turn.
func (s *Sink) writeBatch(wait bool) int {
	if wait {
		s.slots <- struct{}{}
	} else {
		select {
		case s.slots <- struct{}{}:
		default:
			return batchBusy
		}
	}
	defer func() { <-s.slots }()
	if wait {
		s.turn.Lock()
	} else if !s.turn.TryLock() {
		return batchBusy
	}
	s.mu.Lock()
	if s.failed != nil || len(s.queue) == 0 {
		stop := s.closed
		s.mu.Unlock()
		s.turn.Unlock()
		if stop {
			return batchStop
		}
		return batchEmpty
	}
	n := len(s.queue)
	if s.cfg.MaxBatch > 0 && n > s.cfg.MaxBatch {
		n = s.cfg.MaxBatch
	}
	q := s.takeLocked(n)
	batch := q.entries
	s.mu.Unlock()

	pa := s.pa
	var err error
	if pa != nil {
		synced := pa.startAppend(s.cfg.Term, batch, q.recs, q.offs)
		s.turn.Unlock()
		err = synced()
	} else {
		s.turn.Unlock()
		err = s.store.Append(context.Background(), s.cfg.Term, batch)
	}
	s.batches.Add(1)
	s.batchSum.Add(uint64(len(batch)))
	s.batchBuckets[sort.Search(len(BatchBounds), func(i int) bool { return uint64(len(batch)) <= BatchBounds[i] })].Add(1)
	if err != nil {
		s.failures.Add(1)
	}
	bytes := 0
	for i := range batch {
		bytes += entryBytes(&batch[i])
	}
	last := batch[len(batch)-1].Seq
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held -= len(batch)
	s.bytes -= bytes
	if err != nil {
		s.fail(fmt.Errorf("oplog: sink: append seqs %d-%d: %w", batch[0].Seq, last, err))
		return batchWritten
	}
	// A later batch's writer may have got here first: the store
	// publishes in order, so its nil covered this one.
	if last > s.durable.Load() {
		s.durable.Store(last)
	}
	s.wakeNext()
	s.broadcast()
	if pa != nil { // done with q: a Local copied the records out
		s.recycleLocked(q)
	}
	return batchWritten
}

// queued is a batch taken from the queue: its entries, their records
// back to back and each one's offset in them.
type queued struct {
	entries []Entry
	recs    []byte
	offs    []int
}

// takeLocked takes the first n queued entries and their records. A
// queue taken whole starts again in the spare arrays, or in new ones as
// large as the batch (not grown from nothing, copying what it holds
// each time). s.mu is held.
func (s *Sink) takeLocked(n int) *queued {
	end := len(s.recs)
	if n < len(s.queue) {
		end = s.recOffs[n]
	}
	// Capped at the batch: the queue's later appends never reach them.
	q := &queued{entries: s.queue[:n:n], recs: s.recs[:end:end], offs: s.recOffs[:n:n]}
	switch {
	case n < len(s.queue):
		s.queue, s.recs, s.recOffs = s.queue[n:], s.recs[end:], slices.Clone(s.recOffs[n:])
		for i := range s.recOffs {
			s.recOffs[i] -= end
		}
	case s.spare != nil:
		s.queue, s.recs, s.recOffs = s.spare.entries[:0], s.spare.recs[:0], s.spare.offs[:0]
		s.spare = nil
	default:
		s.queue, s.recs, s.recOffs = make([]Entry, 0, n), make([]byte, 0, end), make([]int, 0, n)
	}
	return q
}

// recycleLocked keeps a written batch's arrays as the spare (the larger
// of two, up to maxSpare bytes of records). s.mu is held.
func (s *Sink) recycleLocked(q *queued) {
	if cap(q.recs) > maxSpare || s.spare != nil && cap(s.spare.recs) >= cap(q.recs) {
		return
	}
	clear(q.entries) // drop the keys and payloads
	s.spare = q
}

// maxSpare bounds the records array a sink keeps for its next batches:
// one burst's does not stay allocated for good.
const maxSpare = 4 << 20

// maxEntryFields bounds the msgp bytes of an entry's fields other than
// key and payload (names, seq, term, time, kind, crc, headers).
const maxEntryFields = 64

// entryBytes is what a queued entry counts against SinkConfig.Bytes.
func entryBytes(e *Entry) int { return 2*(len(e.Key)+len(e.Payload)) + recOverhead + maxEntryFields }

// changeSlots is the size of the table LastChange reads (8 bytes each).
const changeSlots = 1 << 14

func (s *Sink) slot(key string) uint64 { return maphash.String(s.seed, key) & (changeSlots - 1) }

// LastChange is a seq at or after the last op on key appended so far (0:
// none since the sink started; everything before is durable). The master
// appends an op while it holds the key's shard lock, so a read of key
// that saw a change sees its seq here once the read returns: waiting for
// LastChange instead of Appended spares reads the commits of other keys'
// writes.
func (s *Sink) LastChange(key string) uint64 { return s.lastOn[s.slot(key)].Load() }

// Appended is the last seq given to an op; Durable the last one the store
// made durable.
func (s *Sink) Appended() uint64 { return s.appended.Load() }

// Durable is the last durable seq.
func (s *Sink) Durable() uint64 { return s.durable.Load() }

// Failed is the error that stopped the sink, or nil.
func (s *Sink) Failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// WaitDurable returns nil once seq is durable, the sink's failure if it
// failed first, or ctx's error. A handler waits for Appended() as read
// after its master call returned: that covers its ops (and maybe a few
// more).
func (s *Sink) WaitDurable(ctx context.Context, seq uint64) error {
	inlineTried := false
	for {
		if s.durable.Load() >= seq {
			return nil
		}
		s.mu.Lock()
		if s.durable.Load() >= seq {
			s.mu.Unlock()
			return nil
		}
		if s.failed != nil {
			err := s.failed
			s.mu.Unlock()
			return err
		}
		if s.closed && len(s.queue) == 0 && s.held == 0 {
			s.mu.Unlock()
			return fmt.Errorf("%w: seq %d not written", ErrClosed, seq)
		}
		if s.pa != nil && !inlineTried && len(s.queue) > 0 && s.queue[0].Seq <= seq {
			// Write it here (once: the batch taken covers seq, or
			// follows a batch that does and is published after it).
			inlineTried = true
			s.mu.Unlock()
			if s.writeBatch(false) == batchWritten {
				continue
			}
			s.mu.Lock()
			if s.durable.Load() >= seq || s.failed != nil {
				s.mu.Unlock()
				continue
			}
		}
		s.kickLocked()
		w := waiter{seq, make(chan struct{})}
		i := sort.Search(len(s.waiters), func(i int) bool { return s.waiters[i].seq > seq })
		s.waiters = slices.Insert(s.waiters, i, w)
		s.mu.Unlock()
		select {
		case <-w.ch:
			s.mu.Lock()
			s.wakeNext()
			s.mu.Unlock()
		case <-ctx.Done():
			s.mu.Lock()
			if i := slices.IndexFunc(s.waiters, func(x waiter) bool { return x.ch == w.ch }); i >= 0 {
				s.waiters = slices.Delete(s.waiters, i, i+1)
			}
			// Woken meanwhile or not, the next waiter must not wait
			// for this one.
			s.wakeNext()
			s.mu.Unlock()
			return ctx.Err()
		}
	}
}

// Close stops taking ops, writes what is queued and stops; it returns the
// sink's failure, if any. It does not close the store, and waits for a
// Store.Append under way (a store that hangs hangs Close).
func (s *Sink) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.kick)
		s.broadcast()
	}
	s.mu.Unlock()
	<-s.done
	s.linger.Stop()
	return s.Failed()
}
