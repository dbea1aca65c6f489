package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/transport"
)

// BatchID is a handle to a batch. It is checked on every call: a freed or
// forged handle gets ErrInvalidBatch, never another batch.
type BatchID uint64

// claiming marks a request whose final state is being written.
const claiming = 0xff

type reqState struct {
	task   transport.Task
	status atomic.Uint32
	// Written by the goroutine that wins the claim, read after status is
	// final.
	n       uint64
	err     error
	latency time.Duration

	submitted time.Time
	lease     transport.Lease
	via       transport.Transport // the transport carrying it
}

func (r *reqState) load() TransferStatus {
	s := Status(r.status.Load())
	if s == claiming {
		s = Pending
	}
	ts := TransferStatus{Status: s}
	if s.Final() {
		ts.Transferred, ts.Err, ts.Latency = r.n, r.err, r.latency
	}
	return ts
}

// finish moves a pending request to a final state; only the first caller
// wins.
func (r *reqState) finish(s Status, n uint64, err error) bool {
	if !r.status.CompareAndSwap(uint32(Pending), claiming) {
		return false
	}
	r.n, r.err, r.latency = n, err, time.Since(r.submitted)
	r.status.Store(uint32(s))
	return true
}

type notifyReq struct {
	seg *segment
	msg string
}

type batch struct {
	e    *Engine
	id   BatchID
	reqs []reqState

	mu sync.Mutex
	n  int // requests submitted so far
	// done is closed when no request is unresolved. doneOpen says it is
	// still ours to close; once resolution starts (possibly handing the
	// channel to a notification goroutine) a new Submit arms a new one.
	done     chan struct{}
	doneOpen bool
	timer    *time.Timer
	notify   *notifyReq
	// notifyErr is the outcome of the last notification. round counts
	// armed done channels, so a notification still in flight from an
	// earlier round cannot write its outcome into a later one.
	notifyErr error
	round     uint64

	unresolved atomic.Int64 // requests whose visible status is not final
	inflight   atomic.Int64 // requests a transport still owns
}

func newBatch(e *Engine, capacity int) *batch {
	b := &batch{e: e, reqs: make([]reqState, capacity), done: make(chan struct{})}
	close(b.done)      // nothing pending yet
	done := b.taskDone // one method value for all tasks: each would allocate
	for i := range b.reqs {
		b.reqs[i].task.Tag = uint64(i)
		b.reqs[i].task.SetDone(done)
	}
	return b
}

// taskDone is the completion callback of every task of the batch.
func (b *batch) taskDone(t *transport.Task, n int, err error) {
	r := &b.reqs[t.Tag]
	r.lease.Release()
	r.lease = transport.Lease{}
	st := Completed
	switch {
	case err == nil:
	case errors.Is(err, transport.ErrTimeout):
		st = Timeout
	default:
		st = Failed
	}
	if err == nil && n != len(t.Local) {
		st, err = Failed, fmt.Errorf("%w: short transfer %d of %d bytes", transport.ErrProtocol, n, len(t.Local))
	}
	if err != nil {
		err = b.e.uninstalledErr(r.via, err)
	}
	won := r.finish(st, uint64(n), err)
	// The transport has let go: count it out before waking waiters, so a
	// FreeBatch right after Wait is not refused.
	b.inflight.Add(-1)
	if won {
		// A request already ended by its deadline was counted then.
		b.e.stats.record(st, n)
		b.resolveOne()
	}
}

func (b *batch) resolveOne() {
	if b.unresolved.Add(-1) != 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.unresolved.Load() != 0 || !b.doneOpen {
		return // a Submit raced in; its completion closes the channel
	}
	if b.timer != nil {
		b.timer.Stop()
	}
	ch, nr := b.done, b.notify
	b.notify = nil
	b.doneOpen = false
	if nr != nil && b.allCompletedLocked() {
		// Deliver before waking waiters, so a completed Wait means the
		// target has the notification.
		round := b.round
		started := b.e.bg.Go(func() {
			err := b.e.sendNotify(nr.seg, nr.msg)
			b.mu.Lock()
			if b.round == round {
				b.notifyErr = err
			}
			b.mu.Unlock()
			close(ch)
		})
		if started {
			return
		}
		b.notifyErr = fmt.Errorf("%w: notification not sent", ErrClosed)
		close(ch)
		return
	}
	if nr != nil {
		b.notifyErr = fmt.Errorf("engine: notification not sent: batch did not complete")
	}
	close(ch)
}

func (b *batch) allCompletedLocked() bool {
	for i := 0; i < b.n; i++ {
		if Status(b.reqs[i].status.Load()) != Completed {
			return false
		}
	}
	return true
}

// expire marks pending requests whose deadline passed as TIMEOUT (or all
// pending ones with the given status when all is set).
func (b *batch) expire(now time.Time, all bool, st Status, cause error) {
	b.mu.Lock()
	n := b.n
	b.mu.Unlock()
	var next time.Time
	for i := 0; i < n; i++ {
		r := &b.reqs[i]
		if Status(r.status.Load()) != Pending {
			continue
		}
		if all || !r.task.Deadline.After(now) {
			r.task.Abort()
			if r.finish(st, 0, cause) {
				b.e.stats.record(st, 0)
				b.resolveOne()
			}
			continue
		}
		if next.IsZero() || r.task.Deadline.Before(next) {
			next = r.task.Deadline
		}
	}
	if !next.IsZero() {
		b.mu.Lock()
		if b.timer != nil && b.unresolved.Load() > 0 {
			b.timer.Reset(time.Until(next))
		}
		b.mu.Unlock()
	}
}

func (b *batch) status() BatchStatus {
	b.mu.Lock()
	n, nerr := b.n, b.notifyErr
	b.mu.Unlock()
	bs := BatchStatus{Requests: n, NotifyErr: nerr}
	for i := 0; i < n; i++ {
		ts := b.reqs[i].load()
		bs.Transferred += ts.Transferred
		switch ts.Status {
		case Completed:
			bs.Completed++
		case Failed:
			bs.Failed++
		case Timeout:
			bs.TimedOut++
		case Canceled:
			bs.Canceled++
		default:
			bs.Pending++
		}
		if bs.Err == nil && ts.Err != nil {
			bs.Err = fmt.Errorf("request %d: %w", i, ts.Err)
		}
	}
	switch {
	case n == 0:
		bs.Status = Waiting
	case bs.Pending > 0:
		bs.Status = Pending
	case bs.Failed > 0:
		bs.Status = Failed
	case bs.TimedOut > 0:
		bs.Status = Timeout
	case bs.Canceled > 0:
		bs.Status = Canceled
	default:
		bs.Status = Completed
	}
	return bs
}

// AllocateBatch returns a batch that holds up to capacity requests.
func (e *Engine) AllocateBatch(capacity int) (BatchID, error) {
	if e.closed.Load() {
		return 0, ErrClosed
	}
	if capacity <= 0 {
		return 0, fmt.Errorf("%w: %d", ErrInvalidCapacity, capacity)
	}
	b := newBatch(e, capacity)
	e.batches.mu.Lock()
	b.id = BatchID(e.batches.addLocked(b))
	e.batches.mu.Unlock()
	return b.id, nil
}

// FreeBatch releases a batch. It is refused with ErrBatchBusy while a
// transport still owns any of its requests (even one already reported as
// TIMEOUT or CANCELED, whose buffer may still be touched).
func (e *Engine) FreeBatch(id BatchID) error {
	b, ok := e.batches.get(uint64(id))
	if !ok {
		return fmt.Errorf("%w: %#x", ErrInvalidBatch, uint64(id))
	}
	if n := b.inflight.Load(); n > 0 {
		return fmt.Errorf("%w: %d requests", ErrBatchBusy, n)
	}
	e.batches.remove(uint64(id))
	b.mu.Lock()
	if b.timer != nil {
		b.timer.Stop()
	}
	b.mu.Unlock()
	return nil
}

func (e *Engine) batch(id BatchID) (*batch, error) {
	b, ok := e.batches.get(uint64(id))
	if !ok {
		return nil, fmt.Errorf("%w: %#x", ErrInvalidBatch, uint64(id))
	}
	return b, nil
}

// Submit validates all requests and starts them. Either every request is
// accepted or none is (the error is a *RequestError naming the first bad
// one). A batch may take several Submit calls up to its capacity.
func (e *Engine) Submit(id BatchID, reqs []Request) error {
	return e.submit(id, reqs, nil)
}

// SubmitWithNotify is Submit plus a notification: once every request of
// the batch has completed successfully, msg is delivered to the segment
// target (its engine queues it for Notifications). Wait returns only after
// the delivery attempt; its outcome is BatchStatus.NotifyErr.
func (e *Engine) SubmitWithNotify(id BatchID, reqs []Request, target SegmentID, msg string) error {
	seg, err := e.segment(target)
	if err != nil {
		return err
	}
	return e.submit(id, reqs, &notifyReq{seg: seg, msg: msg})
}

type route struct {
	seg *segment
	t   transport.Transport
}

func (e *Engine) submit(id BatchID, reqs []Request, nr *notifyReq) error {
	if e.closed.Load() {
		return ErrClosed
	}
	b, err := e.batch(id)
	if err != nil {
		return err
	}
	// Validate everything before touching state, so a refused Submit
	// loses nothing and starts nothing. Validation may refresh a
	// descriptor over the network, so it runs unlocked.
	if len(reqs) == 0 {
		return nil
	}
	routes := make([]route, len(reqs))
	var lastSeg *segment
	for i := range reqs {
		rq := &reqs[i]
		if err := e.checkRequest(rq); err != nil {
			return &RequestError{Index: i, Err: err}
		}
		seg := lastSeg
		if seg == nil || seg.id != rq.Target {
			if seg, err = e.segment(rq.Target); err != nil {
				return &RequestError{Index: i, Err: err}
			}
			lastSeg = seg
		}
		t, err := e.routeRequest(seg, rq.TargetAddr, uint64(len(rq.Local)))
		if err != nil {
			return &RequestError{Index: i, Err: err}
		}
		routes[i] = route{seg: seg, t: t}
	}
	b.mu.Lock()
	// Transports may complete tasks inside Submit, and completion takes
	// b.mu, so the lock is dropped before handing tasks over.
	locked := true
	defer func() {
		if locked {
			b.mu.Unlock()
		}
	}()
	if b.n+len(reqs) > len(b.reqs) {
		return fmt.Errorf("%w: %d submitted + %d new > capacity %d", ErrBatchFull, b.n, len(reqs), len(b.reqs))
	}
	// Pin local memory; undo on failure.
	base := b.n
	now := time.Now()
	deadline := now.Add(e.cfg.TransferTimeout)
	for i := range reqs {
		r := &b.reqs[base+i]
		lease, err := e.reg.Acquire(transport.AddrOf(reqs[i].Local), uint64(len(reqs[i].Local)))
		if err != nil {
			for j := 0; j < i; j++ {
				b.reqs[base+j].lease.Release()
				b.reqs[base+j].lease = transport.Lease{}
			}
			return &RequestError{Index: i, Err: fmt.Errorf("%w: %w", ErrNotRegistered, err)}
		}
		r.lease = lease
		r.task.Op, r.task.Local, r.task.RemoteAddr, r.task.Deadline = reqs[i].Op, reqs[i].Local, reqs[i].TargetAddr, deadline
		r.task.Reset()
		r.submitted = now
		r.via = routes[i].t
		r.n, r.err, r.latency = 0, nil, 0
		r.status.Store(uint32(Pending))
	}
	if !b.doneOpen {
		b.done = make(chan struct{})
		b.doneOpen = true
		b.notifyErr = nil
		b.round++
	}
	if nr != nil {
		b.notify = nr
	}
	b.n += len(reqs)
	b.unresolved.Add(int64(len(reqs)))
	b.inflight.Add(int64(len(reqs)))
	if b.timer == nil {
		b.timer = time.AfterFunc(e.cfg.TransferTimeout, func() { b.expire(time.Now(), false, Timeout, transport.ErrTimeout) })
	} else if b.unresolved.Load() == int64(len(reqs)) {
		b.timer.Reset(e.cfg.TransferTimeout)
	}
	b.mu.Unlock()
	locked = false
	// Hand runs of requests with the same route to their transport in one
	// call.
	tasks := make([]*transport.Task, 0, len(reqs))
	start := 0
	for i := 1; i <= len(reqs); i++ {
		if i < len(reqs) && routes[i] == routes[start] {
			continue
		}
		tasks = tasks[:0]
		for j := start; j < i; j++ {
			tasks = append(tasks, &b.reqs[base+j].task)
		}
		routes[start].t.Submit(routes[start].seg, tasks)
		start = i
	}
	return nil
}

func (e *Engine) checkRequest(rq *Request) error {
	if rq.Op != Read && rq.Op != Write {
		return fmt.Errorf("%w: %d", ErrInvalidOp, rq.Op)
	}
	n := uint64(len(rq.Local))
	if n == 0 {
		return ErrZeroLength
	}
	if rq.TargetAddr+n < rq.TargetAddr {
		return fmt.Errorf("%w: %#x + %d", ErrLengthOverflow, rq.TargetAddr, n)
	}
	if _, ok := e.reg.Find(transport.AddrOf(rq.Local), n); !ok {
		return fmt.Errorf("%w: [%#x,+%d)", ErrNotRegistered, transport.AddrOf(rq.Local), n)
	}
	return nil
}

// Status returns the state of request i of a batch.
func (e *Engine) Status(id BatchID, i int) (TransferStatus, error) {
	b, err := e.batch(id)
	if err != nil {
		return TransferStatus{}, err
	}
	b.mu.Lock()
	n := b.n
	b.mu.Unlock()
	if i < 0 || i >= len(b.reqs) {
		return TransferStatus{}, fmt.Errorf("%w: %d of %d", ErrInvalidIndex, i, len(b.reqs))
	}
	if i >= n {
		return TransferStatus{Status: Waiting}, nil
	}
	return b.reqs[i].load(), nil
}

// BatchStatus summarises a batch without waiting.
func (e *Engine) BatchStatus(id BatchID) (BatchStatus, error) {
	b, err := e.batch(id)
	if err != nil {
		return BatchStatus{}, err
	}
	return b.status(), nil
}

// Done returns a channel closed when no request of the batch is pending
// (a later Submit arms a new channel).
func (e *Engine) Done(id BatchID) (<-chan struct{}, error) {
	b, err := e.batch(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.done, nil
}

// Wait blocks until no request of the batch is pending or ctx ends. When
// ctx ends first, the unfinished requests end TIMEOUT (deadline exceeded)
// or CANCELED, and their transports are told to drop them; FreeBatch
// still waits for the transports to let go. The error is nil only when
// every request completed.
func (e *Engine) Wait(ctx context.Context, id BatchID) (BatchStatus, error) {
	b, err := e.batch(id)
	if err != nil {
		return BatchStatus{}, err
	}
	b.mu.Lock()
	ch := b.done
	b.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		st, cause := Canceled, error(context.Canceled)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			st, cause = Timeout, fmt.Errorf("%w: %w", transport.ErrTimeout, ctx.Err())
		}
		b.expire(time.Now(), true, st, cause)
		<-ch
	}
	bs := b.status()
	switch {
	case bs.Status == Completed && bs.NotifyErr != nil:
		return bs, bs.NotifyErr
	case bs.Status == Completed, bs.Status == Waiting:
		return bs, nil
	case ctx.Err() != nil && bs.Err == nil:
		return bs, ctx.Err()
	default:
		return bs, fmt.Errorf("engine: batch %s: %w", bs.Status, bs.Err)
	}
}

// Cancel ends every pending request of the batch as CANCELED.
func (e *Engine) Cancel(id BatchID) error {
	b, err := e.batch(id)
	if err != nil {
		return err
	}
	b.expire(time.Now(), true, Canceled, context.Canceled)
	return nil
}
