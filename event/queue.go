package event

import (
	"context"
	"sync"
	"time"
)

// OverflowPolicy says what Publish does when the queue is full.
type OverflowPolicy uint8

const (
	// Block makes Publish wait for room (vLLM's behaviour). Nothing is
	// dropped before the socket.
	Block OverflowPolicy = iota
	// DropOldest makes Publish never wait: the oldest queued events are
	// dropped to make room, counted, and the batch number they would have
	// used is skipped so subscribers see a gap.
	DropOldest
)

func (o OverflowPolicy) String() string {
	if o == DropOldest {
		return "drop-oldest"
	}
	return "block"
}

// queue is a bounded multi-producer, single-consumer ring of events.
type queue struct {
	mu      sync.Mutex
	buf     []Event
	head, n int
	policy  OverflowPolicy
	closed  bool

	droppedSincePop uint64
	droppedTotal    uint64

	notEmpty chan struct{} // cap 1: wakes the consumer
	space    chan struct{} // closed and replaced when room appears
	waiters  int
}

func newQueue(size int, policy OverflowPolicy) *queue {
	return &queue{buf: make([]Event, size), policy: policy,
		notEmpty: make(chan struct{}, 1), space: make(chan struct{})}
}

// push appends evs in order. Under Block it waits for room until ctx ends
// (events already pushed stay queued; the error says how many were not).
func (q *queue) push(ctx context.Context, evs []Event) (int, error) {
	q.mu.Lock()
	pushed := 0
	for pushed < len(evs) {
		if q.closed {
			q.mu.Unlock()
			return pushed, ErrClosed
		}
		free := len(q.buf) - q.n
		if free == 0 {
			if q.policy == DropOldest {
				k := min(len(evs)-pushed, len(q.buf))
				for i := range k {
					q.buf[(q.head+i)%len(q.buf)] = nil
				}
				q.head = (q.head + k) % len(q.buf)
				q.n -= k
				q.droppedSincePop += uint64(k)
				q.droppedTotal += uint64(k)
				continue
			}
			space := q.space
			q.waiters++
			q.mu.Unlock()
			q.signal()
			select {
			case <-space:
			case <-ctx.Done():
				return pushed, ctx.Err()
			}
			q.mu.Lock()
			continue
		}
		k := min(free, len(evs)-pushed)
		tail := (q.head + q.n) % len(q.buf)
		for i := range k {
			q.buf[(tail+i)%len(q.buf)] = evs[pushed+i]
		}
		q.n += k
		pushed += k
	}
	q.mu.Unlock()
	q.signal()
	return pushed, nil
}

func (q *queue) signal() {
	select {
	case q.notEmpty <- struct{}{}:
	default:
	}
}

// pop waits for events and appends up to max of them to dst. With linger
// > 0 it waits up to linger after the first event for a full batch. It
// never mixes BlockUpdate with other kinds in one batch. dropped is the
// number of events dropped since the previous pop. ok is false once the
// queue is closed and empty.
func (q *queue) pop(dst []Event, max int, linger time.Duration, timer *time.Timer) (out []Event, dropped uint64, ok bool) {
	q.mu.Lock()
	for q.n == 0 && !q.closed {
		q.mu.Unlock()
		<-q.notEmpty
		q.mu.Lock()
	}
	if q.n == 0 {
		q.mu.Unlock()
		return dst, 0, false
	}
	if linger > 0 && q.n < max && !q.closed {
		timer.Reset(linger)
		for q.n < max && !q.closed {
			q.mu.Unlock()
			select {
			case <-q.notEmpty:
			case <-timer.C:
				q.mu.Lock()
				goto take
			}
			q.mu.Lock()
		}
		timer.Stop()
	}
take:
	isUpdate := q.buf[q.head].Kind() == KindBlockUpdate
	for q.n > 0 && len(dst) < max {
		ev := q.buf[q.head]
		if (ev.Kind() == KindBlockUpdate) != isUpdate {
			break
		}
		dst = append(dst, ev)
		q.buf[q.head] = nil
		q.head = (q.head + 1) % len(q.buf)
		q.n--
	}
	dropped = q.droppedSincePop
	q.droppedSincePop = 0
	if q.waiters > 0 {
		close(q.space)
		q.space = make(chan struct{})
		q.waiters = 0
	}
	q.mu.Unlock()
	return dst, dropped, true
}

// close stops pushes; pop drains what is left, then reports !ok.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	if q.waiters > 0 {
		close(q.space)
		q.space = make(chan struct{})
		q.waiters = 0
	}
	q.mu.Unlock()
	q.signal()
}

// discard empties the queue and returns how many events it held.
func (q *queue) discard() int {
	q.mu.Lock()
	n := q.n
	clear(q.buf)
	q.head, q.n = 0, 0
	q.mu.Unlock()
	return n
}

func (q *queue) depth() (n int, dropped uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n, q.droppedTotal
}
