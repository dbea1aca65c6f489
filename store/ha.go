package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/store/storepb"
)

// LeaderView is the master leadership view an HA client follows: the
// leader's RPC address and the view version (the fencing term). The zero
// view means nobody leads.
type LeaderView struct {
	Leader  string
	Version uint64
}

// IsZero reports whether nobody leads in v.
func (v LeaderView) IsZero() bool { return v == LeaderView{} }

// LeaderSource is the read side of a leader coordinator (ha/leader's
// View and WaitChange) that an HA client follows. Close releases what
// the source opened.
type LeaderSource interface {
	View(ctx context.Context) (LeaderView, error)
	// WaitChange returns the first view whose Version != after.
	WaitChange(ctx context.Context, after uint64) (LeaderView, error)
	Close() error
}

// LeaderOpener opens the LeaderSource of a master address "scheme://...",
// for the cluster id (Config.ClusterID).
type LeaderOpener func(ctx context.Context, addr, clusterID string) (LeaderSource, error)

var leaderSchemes struct {
	sync.RWMutex
	open map[string]LeaderOpener
}

// RegisterLeaderScheme makes master addresses "scheme://..." HA: the
// client finds the leader through open's source. Packages call it from
// init (store/haview registers etcd and redis), so importing one enables
// its schemes, as database/sql drivers do. It panics on an empty scheme,
// one holding "://", or a nil open.
func RegisterLeaderScheme(scheme string, open LeaderOpener) {
	if scheme == "" || strings.Contains(scheme, "://") || open == nil {
		panic(fmt.Sprintf("store: RegisterLeaderScheme(%q) with an invalid scheme or a nil open", scheme))
	}
	leaderSchemes.Lock()
	defer leaderSchemes.Unlock()
	if leaderSchemes.open == nil {
		leaderSchemes.open = map[string]LeaderOpener{}
	}
	leaderSchemes.open[scheme] = open
}

// haviewPackage registers the schemes Crescent ships.
const haviewPackage = "github.com/crescent-kv/crescent/store/haview"

// leaderOpener returns the opener of addr's scheme; ok is false for a
// plain host:port (no HA).
func leaderOpener(addr string) (open LeaderOpener, ok bool, err error) {
	scheme, _, has := strings.Cut(addr, "://")
	if !has {
		return nil, false, nil
	}
	leaderSchemes.RLock()
	open = leaderSchemes.open[scheme]
	leaderSchemes.RUnlock()
	if open == nil {
		if scheme == "etcd" || scheme == "redis" || scheme == "rediss" {
			return nil, true, fmt.Errorf("%w: master address scheme %q not registered: import _ %q", ErrInvalidConfig, scheme, haviewPackage)
		}
		return nil, true, fmt.Errorf("%w: master address scheme %q not registered", ErrInvalidConfig, scheme)
	}
	return open, true, nil
}

// idempotentMethods may be sent again after UNAVAILABLE: repeating them
// on the new leader cannot apply anything twice. Everything else (puts,
// commits, reservations, removes, mount and unmount) returns its error:
// the old leader may have applied it.
var idempotentMethods = map[string]bool{
	"GetReplicaList": true, "BatchGetReplicaList": true,
	"ExistKey": true, "BatchExistKey": true,
	"QuerySegmentStatus": true, "ServiceReady": true,
	"Ping": true, "ReMountSegment": true, "ReportFailedSegments": true,
}

// IdempotentMethods lists the master RPCs an HA client retries on the
// new leader after a failover (sorted).
func IdempotentMethods() []string {
	out := make([]string, 0, len(idempotentMethods))
	for m := range idempotentMethods {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// Failover tuning.
const (
	// haFailThreshold consecutive UNAVAILABLE calls make the client read
	// the view again instead of waiting for the watch.
	haFailThreshold = 3
	// haRetryMin and haRetryMax bound the pause before an idempotent
	// call runs again on a leader that did not answer.
	haRetryMin = 20 * time.Millisecond
	haRetryMax = 250 * time.Millisecond // a new leader serving is found within it
	// haKickMin spaces the reads of the view that failed calls ask for.
	haKickMin = 100 * time.Millisecond
	// haRetryPause spaces reads of the view after the source failed.
	haRetryPause = 200 * time.Millisecond
)

// haConn is the master connection of an HA client: one connection per
// leader view, replaced by switchLeader, the only path that changes it.
// Calls that fail UNAVAILABLE count towards a re-read of the view;
// idempotent ones wait for the next leader (within their context) and
// run again there.
type haConn struct {
	src  LeaderSource
	dial func(ctx context.Context, addr string) (MasterConn, string, error)
	log  *slog.Logger
	// beforeSwitch runs before a new leader's connection is published
	// and returns the putAhead epoch that connection carries (forget's).
	beforeSwitch func(LeaderView) uint64
	onSwitch     func(LeaderView) // after a switch, outside mu
	// timeout bounds a call with its retries when the caller's context
	// has no earlier deadline and the leader's connection bounds each
	// attempt by it (CallTimeout); 0: only the context does.
	timeout time.Duration

	switchMu sync.Mutex // serializes switchLeader (dials included) and Close

	state atomic.Pointer[haState] // replaced, never modified; nil once closed

	seen     atomic.Uint64 // last version the source reported, kept or not
	fails    atomic.Int32  // consecutive UNAVAILABLE calls
	switches atomic.Uint64
	ignored  atomic.Uint64 // views with a version below the current one
	retries  atomic.Uint64 // idempotent calls sent again after UNAVAILABLE
	kick     chan struct{} // read the view now
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// haState is one leader's connection.
type haState struct {
	conn  MasterConn
	proto string
	view  LeaderView
	// epoch is the putAhead epoch of this leader: a request composed
	// with reservations of another is not sent on this connection.
	epoch   uint64
	changed chan struct{} // closed when this state is replaced
}

// errStaleReservations refuses a request whose reservations (ids to
// commit or release, bookings) were made with another leader than the
// connection's: on it, the ids could name other reservations.
var errStaleReservations = errors.New("store: reservations of another master leader")

// epochKey carries the putAhead epoch a request was composed in.
type epochKey struct{}

// guardEpoch marks ctx so that an HA connection sends the request only
// to the leader of putAhead epoch ep.
func (c *Client) guardEpoch(ctx context.Context, ep uint64) context.Context {
	if c.ha == nil {
		return ctx // one master: epochs never change
	}
	return context.WithValue(ctx, epochKey{}, ep)
}

// dialHA opens src's current leader (waiting for one within ctx) and
// starts the monitor.
func dialHA(ctx context.Context, src LeaderSource, dial func(context.Context, string) (MasterConn, string, error), h *haConn) error {
	h.src, h.dial = src, dial
	h.kick = make(chan struct{}, 1)
	v, err := src.View(ctx)
	if err != nil {
		return fmt.Errorf("store: read the master view: %w", err)
	}
	for v.IsZero() {
		if v, err = src.WaitChange(ctx, 0); err != nil {
			return fmt.Errorf("store: no master leader: %w", err)
		}
	}
	h.seen.Store(v.Version)
	conn, proto, err := dial(ctx, v.Leader)
	if err != nil {
		return err
	}
	h.state.Store(&haState{conn: conn, proto: proto, view: v, changed: make(chan struct{})})
	mctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	h.wg.Add(1)
	go h.monitor(mctx)
	return nil
}

// current returns the connection and the view it belongs to.
func (h *haConn) current() (*haState, error) {
	st := h.state.Load()
	if st == nil {
		return nil, status.Error(codes.Canceled, "store: master connection closed")
	}
	return st, nil
}

// View is the leader view the client follows now.
func (h *haConn) View() LeaderView {
	if st := h.state.Load(); st != nil {
		return st.view
	}
	return LeaderView{}
}

// Protocol is the current connection's protocol.
func (h *haConn) Protocol() string {
	st := h.state.Load()
	if st == nil {
		return ""
	}
	if p, ok := st.conn.(interface{ Protocol() string }); ok {
		return p.Protocol()
	}
	return st.proto
}

// leaderGone reports whether err means the leader may be gone: the
// connection is UNAVAILABLE, or it was closed under the call by a switch
// (CANCELED while the caller's context is live).
func leaderGone(ctx context.Context, err error) bool {
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.Canceled:
		return ctx.Err() == nil
	}
	return false
}

// CallTimeout is the bound on each call, retries included, when the
// current leader's connection bounds each attempt by it (0: none, the
// caller's context must).
func (h *haConn) CallTimeout() time.Duration {
	st := h.state.Load()
	if h.timeout <= 0 || st == nil {
		return 0
	}
	if b, ok := st.conn.(callBounder); ok && b.CallTimeout() == h.timeout {
		return h.timeout
	}
	return 0
}

func (h *haConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	idem := idempotentMethods[method[strings.LastIndexByte(method, '/')+1:]]
	pause := haRetryMin
	var start time.Time // for h.timeout over the retries, taken once needed
	if h.timeout > 0 {
		start = time.Now()
	}
	for {
		st, err := h.current()
		if err != nil {
			return err
		}
		if ep, ok := ctx.Value(epochKey{}).(uint64); ok && ep != st.epoch {
			return errStaleReservations
		}
		err = st.conn.Invoke(ctx, method, args, reply, opts...)
		if !leaderGone(ctx, err) {
			h.fails.Store(0)
			return err
		}
		unsent := crpc.NotSent(err) // nobody saw it: safe to send again
		if status.Code(err) == codes.Canceled && !unsent {
			// Its connection was closed by a switch: the old leader may
			// or may not have applied it.
			err = status.Error(codes.Unavailable, "store: the master leader changed during the call")
		}
		if h.fails.Add(1)%haFailThreshold == 0 {
			h.readView()
		}
		if !idem && !unsent {
			return err
		}
		if !start.IsZero() {
			// The retries stay within h.timeout of the call's start (or
			// the context's earlier deadline): the attempts bound only
			// themselves.
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, start.Add(h.timeout))
			defer cancel()
			start = time.Time{}
		}
		// Again on the next leader, or on this one (still warming up, or
		// restarting) after a pause, within the caller's context.
		t := time.NewTimer(pause)
		select {
		case <-st.changed:
			pause = haRetryMin
		case <-t.C:
			pause = min(2*pause, haRetryMax)
		case <-ctx.Done():
			t.Stop()
			return err
		}
		t.Stop()
		h.retries.Add(1)
	}
}

func (h *haConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	st, err := h.current()
	if err != nil {
		return nil, err
	}
	return st.conn.NewStream(ctx, desc, method, opts...)
}

// readView asks the monitor to read the view now.
func (h *haConn) readView() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// monitor follows the view: it waits for changes and, when kicked
// (failed calls), reads it at once; every view goes to switchLeader.
func (h *haConn) monitor(ctx context.Context) {
	defer h.wg.Done()
	type result struct {
		v   LeaderView
		err error
	}
	var lastKick time.Time
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		res := make(chan result, 1)
		after := h.seen.Load()
		go func() {
			v, err := h.src.WaitChange(wctx, after)
			res <- result{v, err}
		}()
		var r result
		select {
		case r = <-res:
		case <-h.kick:
			cancel()
			<-res
			// However fast calls fail, the backend is read at most
			// once per haKickMin for them.
			if d := haKickMin - time.Since(lastKick); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
			}
			lastKick = time.Now()
			r.v, r.err = h.src.View(ctx)
		}
		cancel()
		if r.err != nil {
			if ctx.Err() == nil {
				h.log.Warn("reading the master view failed", "err", r.err)
				t := time.NewTimer(haRetryPause)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
			}
			continue
		}
		h.seen.Store(r.v.Version)
		if _, err := h.switchLeader(ctx, r.v); err != nil && ctx.Err() == nil {
			// Not switched: read the view again after a pause.
			t := time.NewTimer(haRetryPause)
			select {
			case <-t.C:
				h.readView()
			case <-ctx.Done():
				t.Stop()
			}
		}
	}
}

// switchLeader moves the client to view v: the one path that changes the
// master connection. A view without a leader, or whose version is not
// above the current one, is ignored (a lower one is counted); otherwise
// the new leader is dialled, the connection replaced, waiting calls
// released, and the old connection closed (its calls in flight fail, and
// the idempotent ones run again on the new leader).
func (h *haConn) switchLeader(ctx context.Context, v LeaderView) (bool, error) {
	h.switchMu.Lock()
	defer h.switchMu.Unlock()
	cur := h.View()
	if v.IsZero() || v.Version <= cur.Version {
		if !v.IsZero() && v.Version < cur.Version {
			h.ignored.Add(1)
			h.log.Warn("ignoring a master view older than the current one", "view", v.Version, "leader", v.Leader, "current", cur.Version)
		}
		return false, nil
	}
	conn, proto, err := h.dial(ctx, v.Leader)
	if err != nil {
		h.log.Warn("dialling the new master leader failed", "leader", v.Leader, "view", v.Version, "err", err)
		return false, err
	}
	old := h.state.Load()
	if old == nil {
		conn.Close()
		return false, ErrClosed
	}
	// Reservations are forgotten before the new connection is published:
	// from then on a request composed with the old leader's is refused
	// on the new one (errStaleReservations), and one composed with none
	// but the new epoch's is refused on the old one.
	var ep uint64
	if h.beforeSwitch != nil {
		ep = h.beforeSwitch(v)
	}
	h.switches.Add(1)
	h.state.Store(&haState{conn: conn, proto: proto, view: v, epoch: ep, changed: make(chan struct{})})
	close(old.changed)
	h.fails.Store(0)
	h.log.Info("master leader switched", "leader", v.Leader, "view", v.Version, "old_leader", cur.Leader, "old_view", cur.Version)
	old.conn.Close()
	if h.onSwitch != nil {
		h.onSwitch(v)
	}
	return true, nil
}

// Close stops the monitor and closes the connection and the source.
func (h *haConn) Close() error {
	if h.stop != nil {
		h.stop()
	}
	h.wg.Wait()
	h.switchMu.Lock() // no switch in progress
	st := h.state.Swap(nil)
	h.switchMu.Unlock()
	var errs []error
	if st != nil {
		close(st.changed) // waiting calls find it closed
		errs = append(errs, st.conn.Close())
	}
	errs = append(errs, h.src.Close())
	return errors.Join(errs...)
}

// connectHA opens the leader view of MasterAddr and connects to the
// leader it names (waiting for one within ctx).
func (c *Client) connectHA(ctx context.Context, open LeaderOpener) error {
	src, err := open(ctx, c.cfg.MasterAddr, c.cfg.ClusterID)
	if err != nil {
		return fmt.Errorf("store: master view at %s: %w", metadata.Redact(c.cfg.MasterAddr), err)
	}
	h := &haConn{log: c.log, beforeSwitch: c.forgetReservations, onSwitch: c.leaderSwitched, timeout: c.cfg.RPCTimeout}
	dial := func(ctx context.Context, addr string) (MasterConn, string, error) {
		if c.cfg.MasterDialer != nil {
			ctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
			defer cancel()
			conn, err := c.cfg.MasterDialer(ctx, addr, c.stats.interceptor)
			return conn, c.cfg.MasterProtocol, err
		}
		return dialLazy(addr, c.cfg.MasterProtocol, c.stats.interceptor, c.cfg.Security, c.cfg.RPCTimeout)
	}
	if err := dialHA(ctx, src, dial, h); err != nil {
		src.Close()
		return err
	}
	v := h.View()
	c.log.Debug("master leader", "addr", v.Leader, "view", v.Version)
	c.ha, c.conn, c.master, c.rpcProto = h, h, storepb.NewMasterClient(h), c.cfg.MasterProtocol
	return nil
}

// forgetReservations runs before each switch: reservations made on the
// old leader mean nothing to the new one. It returns the new epoch.
func (c *Client) forgetReservations(LeaderView) uint64 {
	if c.ahead == nil {
		return 0
	}
	return c.ahead.forget()
}

// leaderSwitched runs after each switch: a beat now finds out whether
// the new leader knows this client (NEED_REMOUNT re-mounts the segments).
func (c *Client) leaderSwitched(LeaderView) {
	c.beatNow()
}

// Leader is the master leader view the client follows (zero for a
// host:port MasterAddr).
func (c *Client) Leader() LeaderView {
	if c.ha == nil {
		return LeaderView{}
	}
	return c.ha.View()
}
