package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/store/master"
)

// Errors of a Follower.
var (
	// ErrResync: the entries after the replica's seq are compacted away;
	// the caller must rebuild the replica from a snapshot (it also
	// matches oplog.ErrCompacted).
	ErrResync = errors.New("ha: follower must resynchronise from a snapshot")
	// ErrClosed: the follower was closed.
	ErrClosed = errors.New("ha: follower closed")
	// ErrHandedOver: the master was handed over; the follower is done.
	ErrHandedOver = errors.New("ha: follower handed its master over")
)

// FollowerOptions configure NewFollower; the zero value is the default.
type FollowerOptions struct {
	// Notifier wakes the follower when the log grows; default
	// NewNotifier(store, Notify), closed by the follower's Close. A
	// notifier given here stays the caller's.
	Notifier Notifier
	Notify   NotifyOptions
	// Batch is how many entries one read takes (default 1024).
	Batch int
	// Safety is the slow timer that reads the store even when no
	// notification came (a lost watch event); default 1s.
	Safety time.Duration
	// ReadTimeout bounds one store call (default 10s); a failed read is
	// retried at the next wake-up, it does not stop the follower.
	ReadTimeout time.Duration
	Applier     ApplierOptions
	// Logger: nil = slog.Default(), so the application's slog setup applies.
	Logger *slog.Logger
}

// Follower keeps a master replica current from an operation log.
type Follower struct {
	st     oplog.Store
	m      *master.Master
	ap     *Applier
	n      Notifier
	ownN   bool
	opts   FollowerOptions
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	ctl    chan ctlReq
	done   chan struct{}
	once   sync.Once

	mu       sync.Mutex
	err      error         // why it stopped following (fatal), nil while it follows
	moved    chan struct{} // closed (and replaced) when applied, err or closed change
	closed   bool
	lastSeen uint64 // store's LastSeq as last read

	readErrs atomic.Uint64
}

type ctlKind int

const (
	ctlPause ctlKind = iota
	ctlResume
	ctlHandover
)

type ctlReq struct {
	kind ctlKind
	ctx  context.Context
	res  chan error
}

// NewFollower starts following st into m, a replica whose state covers
// the log up to seq applied (built by the caller from a snapshot at that
// seq, or empty at 0). m must not be started (its background loops
// would decide expiries the log already carries) nor logging; the
// follower is its only writer until Handover.
func NewFollower(st oplog.Store, m *master.Master, applied uint64, opts FollowerOptions) (*Follower, error) {
	if st == nil || m == nil {
		return nil, errors.New("ha: NewFollower: nil store or master")
	}
	if opts.Batch <= 0 {
		opts.Batch = 1024
	}
	if opts.Safety <= 0 {
		opts.Safety = time.Second
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	f := &Follower{
		st: st, m: m, ap: NewApplier(m, applied, opts.Applier), n: opts.Notifier, opts: opts,
		log: opts.Logger.With("component", "ha.follower"),
		ctl: make(chan ctlReq), done: make(chan struct{}), moved: make(chan struct{}),
		lastSeen: applied,
	}
	if f.n == nil {
		f.n, f.ownN = NewNotifier(st, opts.Notify), true
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	go f.run()
	return f, nil
}

// Master is the replica (read it freely; only the follower changes it).
func (f *Follower) Master() *master.Master { return f.m }

// Applied is the last seq applied to the replica.
func (f *Follower) Applied() uint64 { return f.ap.Applied() }

// Lag is the store's last seq, as last read, minus Applied.
func (f *Follower) Lag() uint64 {
	f.mu.Lock()
	last := f.lastSeen
	f.mu.Unlock()
	return last - min(last, f.Applied())
}

// Err is why the follower stopped following: an *ApplyError, ErrResync,
// ErrClosed or ErrHandedOver; nil while it follows.
func (f *Follower) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// WaitApplied returns once Applied() >= seq, or the follower's error, or
// ctx's.
func (f *Follower) WaitApplied(ctx context.Context, seq uint64) error {
	for {
		f.mu.Lock()
		moved, err := f.moved, f.err
		f.mu.Unlock()
		if f.Applied() >= seq {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Pause returns once the follower applies nothing and will apply nothing
// until Resume: the replica is quiescent (a snapshot can export it).
func (f *Follower) Pause(ctx context.Context) error { return f.send(ctx, ctlPause) }

// Resume lets a paused follower apply again.
func (f *Follower) Resume() error { return f.send(context.Background(), ctlResume) }

// Handover catches the replica up to the store's last seq (as read now),
// stops following and hands the master over with that seq: from then on
// it is the caller's (to promote it). It applies also when the follower
// is paused. On an error the follower goes on as before (following, or
// paused), unless the error is its own failure (Err).
func (f *Follower) Handover(ctx context.Context) (*master.Master, uint64, error) {
	if err := f.send(ctx, ctlHandover); err != nil {
		return nil, 0, err
	}
	return f.m, f.Applied(), nil
}

func (f *Follower) send(ctx context.Context, k ctlKind) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r := ctlReq{kind: k, ctx: ctx, res: make(chan error, 1)}
	select {
	case f.ctl <- r:
	case <-f.done:
		return f.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r.res:
		return err
	case <-f.done: // Close while the request ran, or the answer came last
		select {
		case err := <-r.res:
			return err
		default:
			return f.Err()
		}
	}
}

// Close stops following and waits for the follower's goroutines; the
// store and the master stay the caller's.
func (f *Follower) Close() error {
	f.once.Do(func() {
		f.cancel()
		<-f.done
		if f.ownN {
			f.n.Close()
		}
		f.stop(ErrClosed)
	})
	return nil
}

// stop records why the follower stopped (the first reason wins).
func (f *Follower) stop(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
		f.kickLocked()
	}
}

func (f *Follower) kickLocked() {
	close(f.moved)
	f.moved = make(chan struct{})
}

func (f *Follower) run() {
	defer close(f.done)
	defer f.stop(ErrClosed) // before done: a waiter then sees why
	safety := time.NewTicker(f.opts.Safety)
	defer safety.Stop()
	paused := false
	more := true // read at once: the log may have grown before we started
	for {
		if more && !paused {
			var err error
			more, err = f.step(f.ctx)
			if err != nil && !isRetry(err) {
				f.stop(err)
				return
			}
		}
		var (
			wait  <-chan struct{}
			timer <-chan time.Time
		)
		if !more || paused {
			wait, timer = f.n.Changed(), safety.C
		} else {
			closed := make(chan struct{}) // poll the control channel, then go on
			close(closed)
			wait = closed
		}
		select {
		case <-f.ctx.Done():
			return
		case r := <-f.ctl:
			switch r.kind {
			case ctlPause:
				paused = true
				r.res <- nil
			case ctlResume:
				paused = false
				more = true
				r.res <- nil
			case ctlHandover:
				hctx, cancel := context.WithCancel(r.ctx)
				stop := context.AfterFunc(f.ctx, cancel)
				fatal, err := f.catchUp(hctx)
				stop()
				cancel()
				switch {
				case err == nil:
					f.stop(ErrHandedOver)
					r.res <- nil
					return
				case fatal:
					f.stop(err)
					r.res <- err
					return
				}
				r.res <- err
				more = true
			}
		case <-wait:
			more = true
		case <-timer:
			more = true
		}
	}
}

// catchUp reads until the replica is at the store's last seq as read
// now, within ctx; fatal says the error stops the follower.
func (f *Follower) catchUp(ctx context.Context) (fatal bool, err error) {
	last, err := f.st.LastSeq(ctx)
	if err != nil {
		return false, fmt.Errorf("ha: handover: last seq: %w", err)
	}
	backoff := time.Millisecond
	for f.Applied() < last {
		_, err := f.step(ctx)
		if err != nil && !isRetry(err) {
			return true, err
		}
		if cerr := ctx.Err(); cerr != nil {
			if err == nil {
				err = cerr
			}
			return false, fmt.Errorf("ha: handover at seq %d of %d: %w", f.Applied(), last, err)
		}
		if err == nil {
			backoff = time.Millisecond
			continue
		}
		select { // a failed read: the store may come back within ctx
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
	return false, nil
}

// step reads one batch after the applied seq and applies it. more says
// the store holds entries past it. A fatal error (the applier's, or
// ErrResync) is returned; a failed read is counted, logged and left to
// the next wake-up.
func (f *Follower) step(ctx context.Context) (more bool, fatal error) {
	rctx, cancel := context.WithTimeout(ctx, f.opts.ReadTimeout)
	defer cancel()
	next := f.Applied() + 1
	// LastSeq first: everything up to it is durable, so a read from next
	// that comes back short of it shows a hole, not a race.
	last, err := f.st.LastSeq(rctx)
	if err != nil {
		return false, f.readFailed(ctx, next, err)
	}
	f.mu.Lock()
	f.lastSeen = max(f.lastSeen, last)
	f.mu.Unlock()
	if last < next {
		return false, nil
	}
	es, rerr := f.st.Read(rctx, next, int(min(uint64(f.opts.Batch), last-next+1)))
	end := next - 1
	if len(es) > 0 {
		end = es[len(es)-1].Seq
	}
	// What a failed read returned before its error is applied first, so
	// the fault is pinned to the seq after it.
	if err := f.ap.Apply(es...); err != nil {
		return false, err
	}
	if rerr != nil {
		return false, f.readFailed(ctx, f.Applied()+1, rerr)
	}
	if err := f.ap.Complete(max(end, next)); err != nil {
		return false, err
	}
	f.mu.Lock()
	f.kickLocked()
	f.mu.Unlock()
	return f.Applied() < last, nil
}

// readFailed sorts a store error: a compacted or corrupt log, or a closed
// store, stops the follower; anything else is retried later.
func (f *Follower) readFailed(ctx context.Context, next uint64, err error) error {
	switch {
	case errors.Is(err, oplog.ErrCompacted):
		return fmt.Errorf("%w: seq %d: %w", ErrResync, next, err)
	case errors.Is(err, oplog.ErrCorrupt):
		f.ap.failWith(next, ErrChecksum, err)
		return f.ap.Err()
	case errors.Is(err, oplog.ErrClosed):
		return err
	}
	if ctx.Err() == nil {
		f.readErrs.Add(1)
		f.log.Warn("ha: reading the log failed; retrying", "seq", next, "err", err)
	}
	return retry{err}
}

// retry marks a store error worth another attempt.
type retry struct{ err error }

func (r retry) Error() string { return r.err.Error() }
func (r retry) Unwrap() error { return r.err }

func isRetry(err error) bool {
	var r retry
	return errors.As(err, &r)
}
