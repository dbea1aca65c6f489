package ha

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/crescent-kv/crescent/ha/oplog"
)

// Notifier tells a follower that the log may have grown. A value on
// Changed is a hint, never a promise: the follower reads the store to
// learn what is there, so a spurious or coalesced signal costs nothing.
type Notifier interface {
	// Changed has a buffer of one: signals that arrive while one is
	// pending merge into it.
	Changed() <-chan struct{}
	// Close stops the notifier and waits for its goroutine.
	Close() error
}

// NotifyOptions configure NewNotifier; the zero value is the default.
type NotifyOptions struct {
	// PollInterval is how often a store without a wake-up (neither etcd
	// nor a Local in this process) is asked for LastSeq; default 10ms.
	PollInterval time.Duration
	// RetryMin and RetryMax bound the backoff between attempts to
	// re-establish an etcd watch; defaults 50ms and 5s.
	RetryMin, RetryMax time.Duration

	startRev int64 // tests: the revision the first watch starts from
}

func (o *NotifyOptions) fill() {
	if o.PollInterval <= 0 {
		o.PollInterval = 10 * time.Millisecond
	}
	if o.RetryMin <= 0 {
		o.RetryMin = 50 * time.Millisecond
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(5*time.Second, o.RetryMin)
	}
}

// What stores may offer beyond oplog.Store.
type (
	watched interface {
		Watched() (*clientv3.Client, string)
	} // *oplog.Etcd
	notifying interface{ Notify() <-chan struct{} } // *oplog.Local
)

// NewNotifier picks the notifier for st: a watch on the durable prefix
// for etcd, the writer's wake-up for a Local store, polling LastSeq for
// any other store.
func NewNotifier(st oplog.Store, opts NotifyOptions) Notifier {
	opts.fill()
	switch s := st.(type) {
	case watched:
		cli, key := s.Watched()
		return newEtcdNotifier(cli, key, opts)
	case notifying:
		return newWakeNotifier(st, s.Notify)
	}
	return newPollNotifier(st, opts.PollInterval)
}

// base is the part every notifier shares: the signal and the goroutine.
type base struct {
	ch     chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func newBase() base {
	ctx, cancel := context.WithCancel(context.Background())
	return base{ch: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

func (b *base) Changed() <-chan struct{} { return b.ch }

func (b *base) fire() {
	select {
	case b.ch <- struct{}{}:
	default:
	}
}

func (b *base) Close() error {
	b.once.Do(b.cancel)
	<-b.done
	return nil
}

// pollNotifier asks the store for LastSeq every interval and fires when
// it moved.
type pollNotifier struct {
	base
	st    oplog.Store
	every time.Duration
}

func newPollNotifier(st oplog.Store, every time.Duration) *pollNotifier {
	n := &pollNotifier{base: newBase(), st: st, every: every}
	go n.run()
	return n
}

func (n *pollNotifier) run() {
	defer close(n.done)
	t := time.NewTicker(n.every)
	defer t.Stop()
	var seen uint64
	for {
		if last, err := n.st.LastSeq(n.ctx); err == nil && last != seen {
			seen = last
			n.fire()
		}
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// wakeNotifier waits on a Local store's Notify channel: no polling.
type wakeNotifier struct {
	base
	st     oplog.Store
	notify func() <-chan struct{}
}

func newWakeNotifier(st oplog.Store, notify func() <-chan struct{}) *wakeNotifier {
	n := &wakeNotifier{base: newBase(), st: st, notify: notify}
	go n.run()
	return n
}

func (n *wakeNotifier) run() {
	defer close(n.done)
	var seen uint64
	for {
		grew := n.notify() // before LastSeq: a growth in between closes it
		if last, err := n.st.LastSeq(n.ctx); err == nil && last != seen {
			seen = last
			n.fire()
		}
		select {
		case <-n.ctx.Done():
			return
		case <-grew:
		}
	}
}
