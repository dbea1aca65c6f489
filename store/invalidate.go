package store

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/store/storepb"
)

// InvalidationHandler receives a subscription's invalidations: Invalidate
// with keys whose stored value is gone (removed, evicted, lost; a re-put
// comes after) or lost a replica with its segment, InvalidateAll when the
// subscriber may have missed some (a new subscription, a gap, an overflow
// on the master). Both run on the
// watch's goroutine and must return only once the keys are dropped: the
// next poll acknowledges them, and a remove on the master waits for that.
type InvalidationHandler interface {
	Invalidate(keys []string)
	InvalidateAll()
}

// InvalidationWatch is a live invalidation subscription (WatchInvalidations).
type InvalidationWatch struct {
	c     *Client
	h     InvalidationHandler
	base  time.Time       // monotonic origin of fresh
	fresh atomic.Int64    // ns since base until which cached values may be served
	ctx   context.Context // ends at Close
	stop  context.CancelFunc
	done  chan struct{}

	polls, resets atomic.Uint64
	paused        atomic.Bool // tests: stop polling, as a stopped process would
	idle          atomic.Bool // the loop saw paused and has no poll in flight
}

// invalidationWait is how long a poll asks the master to hold an answer
// with nothing in it (the master caps it at a third of its TTL).
const invalidationWait = time.Second

// WatchInvalidations subscribes to the master's invalidations and hands
// them to h until Close. Fresh reports whether values cached before now
// may be served without asking the master: only while the subscription
// is live, within the master's TTL of the poll of its last answer.
func (c *Client) WatchInvalidations(h InvalidationHandler) *InvalidationWatch {
	w := &InvalidationWatch{c: c, h: h, base: time.Now(), done: make(chan struct{})}
	w.ctx, w.stop = context.WithCancel(context.Background())
	go w.loop()
	return w
}

// Fresh reports whether the subscription is live and fresh.
func (w *InvalidationWatch) Fresh() bool {
	return int64(time.Since(w.base)) < w.fresh.Load()
}

// WaitFresh waits until the subscription is fresh or ctx ends.
func (w *InvalidationWatch) WaitFresh(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !w.Fresh() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.ctx.Done():
			return ErrClosed
		case <-t.C:
		}
	}
	return nil
}

// Polls and Resets count answers and drops of everything.
func (w *InvalidationWatch) Polls() uint64  { return w.polls.Load() }
func (w *InvalidationWatch) Resets() uint64 { return w.resets.Load() }

// Close ends the subscription: it tells the master, which then forgets
// it at once (else after 10 TTLs; its barriers stop waiting for a
// subscriber silent for one TTL).
func (w *InvalidationWatch) Close() {
	w.stop()
	<-w.done
}

// PauseForTest stops (true) or resumes polling. Stopping returns once no
// poll is in flight (an answer could otherwise still arrive after it).
func (w *InvalidationWatch) PauseForTest(p bool) {
	w.paused.Store(p)
	for p && !w.idle.Load() {
		select {
		case <-w.done:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

func (w *InvalidationWatch) loop() {
	defer close(w.done)
	var sub, last uint64
	defer func() { w.unsubscribe(sub) }()
	warned := false
	backoff := 10 * time.Millisecond
	for {
		if w.ctx.Err() != nil {
			return
		}
		// idle is cleared before paused is read, so a PauseForTest that
		// saw idle set knows this loop will see paused.
		w.idle.Store(false)
		if w.paused.Load() || w.c.closed.Load() {
			w.idle.Store(w.paused.Load())
			if !w.sleep(10 * time.Millisecond) {
				return
			}
			continue
		}
		ctx, cancel := context.WithTimeout(w.ctx, invalidationWait+w.c.cfg.RPCTimeout)
		sent := time.Since(w.base)
		resp, err := w.c.master.WaitInvalidations(ctx, &storepb.WaitInvalidationsRequest{Subscription: sub, Ack: last,
			WaitMs: uint32(invalidationWait / time.Millisecond)})
		cancel()
		if err != nil {
			if status.Code(err) == codes.Unimplemented && !warned {
				warned = true
				w.c.log.Warn("store: the master does not serve WaitInvalidations (an older version): cached values are never served", "err", err)
			}
			if !w.sleep(backoff) {
				return
			}
			backoff = min(2*backoff, 200*time.Millisecond)
			continue
		}
		backoff = 10 * time.Millisecond
		w.polls.Add(1)
		switch {
		case resp.Reset_ || resp.Subscription != sub:
			w.dropAll()
		case len(resp.Items) > 0:
			if resp.First != last+1 || resp.Last < resp.First {
				w.dropAll() // a gap
				break
			}
			keys := make([]string, len(resp.Items))
			for i, it := range resp.Items {
				keys[i] = it.Key
			}
			w.h.Invalidate(keys)
		case resp.Last != last:
			w.dropAll()
		}
		sub, last = resp.Subscription, resp.Last
		if !resp.More {
			// Freshness from the poll's sending, a tenth short of the
			// master's TTL for clock rate differences.
			ttl := time.Duration(resp.TtlMs) * time.Millisecond
			w.fresh.Store(int64(sent + ttl - ttl/10))
		}
	}
}

// unsubscribe tells the master subscription sub ended, waiting at most a
// second for it (a master that does not answer forgets it on its own).
func (w *InvalidationWatch) unsubscribe(sub uint64) {
	if sub == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(time.Second, w.c.cfg.RPCTimeout))
	defer cancel()
	if _, err := w.c.master.WaitInvalidations(ctx, &storepb.WaitInvalidationsRequest{Subscription: sub, Unsubscribe: true}); err != nil {
		w.c.log.Debug("store: ending the invalidation subscription", "err", err)
	}
}

func (w *InvalidationWatch) dropAll() {
	w.resets.Add(1)
	w.h.InvalidateAll()
}

func (w *InvalidationWatch) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
