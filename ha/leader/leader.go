package leader

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// View is the leadership view. Version is the fencing term; the zero
// View means no leader.
type View struct {
	Leader  string
	Version uint64
}

// IsZero reports whether the view has no leader.
func (v View) IsZero() bool { return v == View{} }

// Loss reasons, reported by Session.Err (usable with errors.Is).
var (
	ErrRenew          = errors.New("leader: renew failed")
	ErrLeadershipLost = errors.New("leader: leadership lost")
	ErrClosed         = errors.New("leader: session closed")
	// ErrInvalid marks bad configuration or arguments.
	ErrInvalid = errors.New("leader: invalid argument")
	// ErrBadView marks a view in the backend that no coordinator wrote
	// (an address longer than MaxAddrLen, a version that is no number).
	ErrBadView = errors.New("leader: bad view")
)

// Coordinator elects one leader per cluster.
type Coordinator interface {
	// View reads the current view (zero when nobody leads).
	View(ctx context.Context) (View, error)
	// TryAcquire tries once to become leader as addr. Acquired: a live
	// Session and its view. Contended: a nil Session and the observed
	// view. Never both.
	TryAcquire(ctx context.Context, addr string) (Session, View, error)
	// WaitChange returns the first view whose Version != after, or the
	// context's error.
	WaitChange(ctx context.Context, after uint64) (View, error)
	// Close ends every live session with ErrClosed (their leases then
	// expire on the backend) and stops background work. It does not
	// close the client passed in.
	Close() error
}

// Session is held leadership, renewed in the background until it ends.
type Session interface {
	// Term is the view version this session holds (the fencing term).
	Term() uint64
	// Renew renews the lease once, now; losing it ends the session.
	Renew(ctx context.Context) error
	// Release ends the session with ErrClosed and gives up the view if it
	// is still ours.
	Release(ctx context.Context) error
	// Lost is closed when the session ends, for whatever reason.
	Lost() <-chan struct{}
	// Err is nil while the session lives, then the reason it ended:
	// wrapping ErrRenew, ErrLeadershipLost or ErrClosed.
	Err() error
	// Deadline is the latest time this process may act as leader: the
	// send time of the last renewal (or the acquisition) the backend
	// confirmed, plus the TTL. The backend counts its expiry from when it
	// received that renewal, so it never expires the lease before
	// Deadline; a session nothing renews ends at Deadline (ErrRenew), by
	// this process's clock, without waiting for the backend to say so.
	// Whoever acquires the view after this session's lease expired
	// therefore acquires it after Deadline.
	Deadline() time.Time
}

// Monitor calls fn exactly once, with the session's loss reason, when
// the session ends (Release included: ErrClosed). fn runs on its own
// goroutine, which exits after it.
func Monitor(s Session, fn func(reason error)) {
	go func() {
		<-s.Lost()
		fn(s.Err())
	}()
}

// Option configures a coordinator.
type Option func(*options)

type options struct {
	prefix  string
	ttl     time.Duration
	poll    time.Duration
	minTerm uint64
	minSet  bool
}

const (
	// DefaultPrefix is the key prefix when WithPrefix is not given.
	DefaultPrefix = "crescent"
	// DefaultTTL is the lease TTL when WithTTL is not given.
	DefaultTTL = 5 * time.Second
	// DefaultPollInterval is Redis's WaitChange poll period.
	DefaultPollInterval = 200 * time.Millisecond
	// minRenewInterval bounds Redis's renew period from below.
	minRenewInterval = 200 * time.Millisecond
)

// WithPrefix sets the key prefix (default "crescent").
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithTTL sets the lease TTL (default 5 s; etcd rounds up to whole
// seconds and may raise it to its minimum).
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithPollInterval sets how often Redis's WaitChange reads the view
// (default 200 ms). Ignored by etcd, which watches.
func WithPollInterval(d time.Duration) Option { return func(o *options) { o.poll = d } }

// WithMinTerm makes every term Redis hands out greater than t. Redis's
// term counter restarts after a data loss; the supervisor seeds it from
// the log's last term so fencing still holds. etcd rejects it: its
// revisions never go back.
func WithMinTerm(t uint64) Option { return func(o *options) { o.minTerm, o.minSet = t, true } }

func buildOptions(clusterID string, opts []Option) (options, error) {
	o := options{prefix: DefaultPrefix, ttl: DefaultTTL, poll: DefaultPollInterval}
	for _, f := range opts {
		f(&o)
	}
	switch {
	case clusterID == "":
		return o, fmt.Errorf("%w: empty cluster id", ErrInvalid)
	case strings.ContainsAny(clusterID, "/{}:"):
		return o, fmt.Errorf("%w: cluster id %q contains one of / { } :", ErrInvalid, clusterID)
	case o.prefix == "" || strings.ContainsAny(o.prefix, "{}"):
		return o, fmt.Errorf("%w: prefix %q is empty or contains { }", ErrInvalid, o.prefix)
	case o.ttl <= 0:
		return o, fmt.Errorf("%w: ttl %v", ErrInvalid, o.ttl)
	case o.poll <= 0:
		return o, fmt.Errorf("%w: poll interval %v", ErrInvalid, o.poll)
	}
	return o, nil
}

func checkAddr(addr string) error {
	if addr == "" {
		return fmt.Errorf("%w: empty leader address", ErrInvalid)
	}
	if len(addr) > MaxAddrLen {
		return fmt.Errorf("%w: leader address of %d bytes, more than %d", ErrInvalid, len(addr), MaxAddrLen)
	}
	return nil
}

// MaxAddrLen bounds a leader address, written or read: anyone who can
// write the view key could otherwise make every reader hold a value as
// large as the backend stores.
const MaxAddrLen = 4096

// checkView refuses a view address read back that no master could have
// written.
func checkView(n int) error {
	if n > MaxAddrLen {
		return fmt.Errorf("%w: view holds a leader address of more than %d bytes", ErrBadView, MaxAddrLen)
	}
	return nil
}

// ending is the end-once state shared by both backends' sessions.
type ending struct {
	once sync.Once
	lost chan struct{}
	err  atomic.Pointer[error] // read on every RPC through the gate: no lock
}

func newEnding() ending { return ending{lost: make(chan struct{})} }

// leaseClock is a session's Deadline, extended by confirmed renewals. It
// is read on every RPC (the leader's gate), so it is one atomic load; the
// time.Time keeps its monotonic reading.
type leaseClock struct {
	deadline atomic.Pointer[time.Time]
}

func (l *leaseClock) Deadline() time.Time {
	if d := l.deadline.Load(); d != nil {
		return *d
	}
	return time.Time{}
}

// extend moves the deadline to d unless it is already later (answers
// to renewals may arrive out of order).
func (l *leaseClock) extend(d time.Time) {
	for {
		old := l.deadline.Load()
		if old != nil && !d.After(*old) {
			return
		}
		if l.deadline.CompareAndSwap(old, &d) {
			return
		}
	}
}

// end records the first reason and closes Lost; later calls do nothing.
func (e *ending) end(reason error) bool {
	first := false
	e.once.Do(func() {
		e.err.Store(&reason)
		close(e.lost)
		first = true
	})
	return first
}

func (e *ending) Lost() <-chan struct{} { return e.lost }

func (e *ending) Err() error {
	if p := e.err.Load(); p != nil {
		return *p
	}
	return nil
}

// registry tracks a coordinator's live sessions for Close.
type registry struct {
	mu     sync.Mutex
	closed bool
	live   map[interface{ close() }]struct{}
}

func (r *registry) add(s interface{ close() }) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	if r.live == nil {
		r.live = map[interface{ close() }]struct{}{}
	}
	r.live[s] = struct{}{}
	return true
}

func (r *registry) remove(s interface{ close() }) {
	r.mu.Lock()
	delete(r.live, s)
	r.mu.Unlock()
}

func (r *registry) closeAll() {
	r.mu.Lock()
	r.closed = true
	live := r.live
	r.live = nil
	r.mu.Unlock()
	for s := range live {
		s.close()
	}
}

func (r *registry) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}
