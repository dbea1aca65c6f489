package supervisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/ha"
	"github.com/crescent-kv/crescent/ha/leader"
	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/store/master"
)

// Role is where the supervisor is in its cycle.
type Role int32

// Roles, in the order of one cycle.
const (
	Standby Role = iota
	Candidate
	Warmup
	Leader
)

var roleNames = [...]string{"standby", "candidate", "warmup", "leader"}

func (r Role) String() string {
	if r < 0 || int(r) >= len(roleNames) {
		return fmt.Sprintf("role(%d)", int(r))
	}
	return roleNames[r]
}

// Status is what /role shows.
type Status struct {
	Role Role
	// Term is the session's term while candidate (once acquired), in
	// warm-up or leader; 0 otherwise.
	Term uint64
	// Leader is the last view seen (the zero View: nobody leads).
	View leader.View
	// AppliedSeq is the replica's last applied seq (standby) or the
	// sink's durable seq (leader).
	AppliedSeq uint64
}

// Config configures New. Every func field is required.
type Config struct {
	// Coordinator returns the coordinator of one election round. logTerm
	// is the log's highest term as read now: a Redis coordinator must be
	// built with leader.WithMinTerm(logTerm), so that its terms stay
	// above the log's. The supervisor closes it at the end of the round.
	Coordinator func(ctx context.Context, logTerm uint64) (leader.Coordinator, error)
	// Advertise is the address put into the view (host:port of the RPC
	// port).
	Advertise string
	// TTL is the coordinator's lease TTL: a standby re-reads the view at
	// least that often.
	TTL time.Duration
	// Warmup is how long a new leader waits after acquiring the view
	// before it serves, unless the last leader released (see Released).
	// Every leader stops answering at its session's Deadline (the send
	// time of its last confirmed renewal plus the TTL: Serve's lease
	// func), which is never after the backend expires its lease, and the
	// view can be acquired only after that expiry: so the wait needs to
	// cover only clocks running at different rates and the old leader's
	// stop. 0 means one full TTL, the reference's warm-up.
	Warmup time.Duration
	// OpenLog opens the operation log. term 0: a reader (the standby's
	// follower). term > 0: claim the log with that term
	// (oplog.EtcdOptions.Term), which fences any writer with a lower one.
	OpenLog func(ctx context.Context, term uint64) (oplog.Store, error)
	// Replica builds a fresh master, not started, whose Config.OpLog is
	// sink, and returns the seq its state covers (from a snapshot, or 0).
	Replica func(ctx context.Context, sink master.OpSink) (*master.Master, uint64, error)
	// Serve serves d (started) until ctx ends, then stops serving and
	// returns; d stays the supervisor's to close. lease is nil while the
	// session may still act as leader (alive and before its Deadline),
	// else why not: Serve must check it before every answer
	// (service.WithGate), so that nothing is answered past the deadline
	// even before ctx ends.
	Serve func(ctx context.Context, d *oplog.Durable, lease func() error) error

	// Released and ReleasedTerm (optional, both or neither) keep a
	// marker, next to the log, of the last term that stopped serving for
	// good: Released(term) is called once this master no longer serves
	// that term (the log closed, before the view is released);
	// ReleasedTerm reads it. A candidate skips the warm-up when the
	// marker equals the log's term before its claim: the last master
	// that could have served has stopped (a SIGTERM hand-off takes no
	// TTL). Any other case (no marker, a later claim, a read error)
	// warms up.
	Released     func(ctx context.Context, term uint64) error
	ReleasedTerm func(ctx context.Context) (uint64, error)

	Follower ha.FollowerOptions
	// Retry is the pause after a failed round (default 1s).
	Retry time.Duration
	// Logger: nil = slog.Default(), so the application's slog setup applies.
	Logger *slog.Logger
}

// Supervisor runs one master's HA cycle (see the package doc).
type Supervisor struct {
	cfg Config
	log *slog.Logger

	role       atomic.Int32
	term       atomic.Uint64
	elections  atomic.Uint64
	timeToServ atomic.Int64 // ns, last

	mu   sync.Mutex
	view leader.View
	fol  *ha.Follower
	dur  *oplog.Durable
}

// New checks cfg and returns a supervisor in standby; Run runs it.
func New(cfg Config) (*Supervisor, error) {
	switch {
	case cfg.Coordinator == nil || cfg.OpenLog == nil || cfg.Replica == nil || cfg.Serve == nil:
		return nil, errors.New("supervisor: Coordinator, OpenLog, Replica and Serve are required")
	case cfg.Advertise == "":
		return nil, errors.New("supervisor: empty advertise address")
	case (cfg.Released == nil) != (cfg.ReleasedTerm == nil):
		return nil, errors.New("supervisor: Released and ReleasedTerm go together")
	case cfg.TTL <= 0:
		return nil, fmt.Errorf("supervisor: TTL %v must be positive", cfg.TTL)
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Follower.Logger == nil {
		cfg.Follower.Logger = cfg.Logger
	}
	return &Supervisor{cfg: cfg, log: cfg.Logger.With("component", "ha.supervisor")}, nil
}

// Status is a snapshot of the supervisor's state.
func (s *Supervisor) Status() Status {
	st := Status{Role: Role(s.role.Load()), Term: s.term.Load()}
	s.mu.Lock()
	defer s.mu.Unlock()
	st.View = s.view
	switch {
	case s.dur != nil:
		st.AppliedSeq = s.dur.Sink.Durable()
	case s.fol != nil:
		st.AppliedSeq = s.fol.Applied()
	}
	return st
}

// Serving reports whether this master serves as leader now.
func (s *Supervisor) Serving() bool { return Role(s.role.Load()) == Leader }

func (s *Supervisor) setRole(r Role, term uint64) {
	s.term.Store(term)
	s.role.Store(int32(r))
}

func (s *Supervisor) setView(v leader.View) {
	s.mu.Lock()
	s.view = v
	s.mu.Unlock()
}

// Run runs the cycle until ctx ends. Leading when it ends, it stops
// serving, closes the log and releases the view (a standby takes over at
// once), then returns nil.
func (s *Supervisor) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := s.round(ctx)
		s.setRole(Standby, 0)
		if err == nil || ctx.Err() != nil {
			continue
		}
		s.log.Error("ha round failed; back to standby", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(s.cfg.Retry):
		}
	}
	return nil
}

// forwarder is the replica's OpLog: nothing while it follows (Replay
// never logs, and the replica is not started), the sink once promoted.
type forwarder struct{ s atomic.Pointer[oplog.Sink] }

func (f *forwarder) Append(op *master.Op) {
	s := f.s.Load()
	if s == nil {
		panic("supervisor: a standby replica logged an op")
	}
	s.Append(op)
}

// round is one cycle: a fresh replica following the log, elections until
// this master wins one, then lead until the session ends.
func (s *Supervisor) round(ctx context.Context) error {
	fw := &forwarder{}
	m, seq, err := s.cfg.Replica(ctx, fw)
	if err != nil {
		return fmt.Errorf("build the replica: %w", err)
	}
	rd, err := s.cfg.OpenLog(ctx, 0)
	if err != nil {
		m.Close()
		return fmt.Errorf("open the log: %w", err)
	}
	f, err := ha.NewFollower(rd, m, seq, s.cfg.Follower)
	if err != nil {
		m.Close()
		rd.Close()
		return err
	}
	s.mu.Lock()
	s.fol = f
	s.mu.Unlock()
	promoted := false
	defer func() {
		s.mu.Lock()
		s.fol = nil
		s.mu.Unlock()
		f.Close()
		rd.Close()
		if !promoted {
			m.Close()
		}
	}()
	s.log.Info("standby: following the log", "from_seq", seq+1)
	for ctx.Err() == nil {
		if err := f.Err(); err != nil {
			return fmt.Errorf("follower: %w", err)
		}
		c, sess, err := s.elect(ctx, rd)
		if err != nil {
			return err
		}
		if sess == nil {
			continue
		}
		promoted = true // lead owns m from here
		return s.lead(ctx, c, sess, rd, f, fw)
	}
	return nil
}

// logTerm reads the log's highest term afresh.
func logTerm(ctx context.Context, st oplog.Store) (uint64, error) {
	if _, err := st.LastSeq(ctx); err != nil { // re-reads the prefix
		return 0, err
	}
	if t, ok := st.(interface{ Term() uint64 }); ok {
		return t.Term(), nil
	}
	return 0, nil
}

// elect tries once to acquire if nobody leads, else waits (at most a
// TTL) for the view to change. It returns the coordinator and the
// session when this master won; the coordinator is closed otherwise.
func (s *Supervisor) elect(ctx context.Context, rd oplog.Store) (leader.Coordinator, leader.Session, error) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.TTL)
	defer cancel()
	lt, err := logTerm(rctx, rd)
	if err != nil && ctx.Err() == nil {
		s.log.Warn("standby: reading the log's term", "err", err)
		s.pause(ctx, s.cfg.TTL)
		return nil, nil, nil
	}
	c, err := s.cfg.Coordinator(ctx, lt)
	if err != nil {
		return nil, nil, fmt.Errorf("coordinator: %w", err)
	}
	v, err := c.View(rctx)
	if err == nil && v.IsZero() {
		s.setRole(Candidate, 0)
		var sess leader.Session
		sess, v, err = c.TryAcquire(rctx, s.cfg.Advertise)
		if err == nil && sess != nil {
			s.setView(v)
			return c, sess, nil
		}
		s.setRole(Standby, 0)
	}
	if err != nil {
		c.Close()
		if ctx.Err() == nil {
			s.log.Warn("standby: election backend", "err", err)
			s.pause(ctx, s.cfg.Retry)
		}
		return nil, nil, nil
	}
	s.setView(v)
	// Wait for a change, a TTL at most (the follower's health and the
	// log's term are checked again then).
	if nv, err := c.WaitChange(rctx, v.Version); err == nil {
		s.setView(nv)
	}
	c.Close()
	return nil, nil, nil
}

// needWarmup is false only when the released marker is the log's term
// as read now, before this master's claim.
func (s *Supervisor) needWarmup(ctx context.Context, rd oplog.Store) bool {
	if s.cfg.ReleasedTerm == nil {
		return true
	}
	lt, err := logTerm(ctx, rd)
	if err != nil || lt == 0 {
		return true
	}
	rt, err := s.cfg.ReleasedTerm(ctx)
	return err != nil || rt != lt
}

func (s *Supervisor) pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// lead runs an acquired session: claim the log, final catch-up,
// warm-up, serve; then close and release. It owns c, sess and the
// follower's master.
func (s *Supervisor) lead(ctx context.Context, c leader.Coordinator, sess leader.Session, rd oplog.Store, f *ha.Follower, fw *forwarder) (err error) {
	acquired := time.Now()
	term := sess.Term()
	s.elections.Add(1)
	s.setRole(Candidate, term)
	log := s.log.With("term", term)
	log.Info("candidate: acquired leadership", "advertise", s.cfg.Advertise)
	var d *oplog.Durable
	m := f.Master()
	defer func() {
		s.mu.Lock()
		s.dur = nil
		s.mu.Unlock()
		s.setRole(Standby, 0)
		if d != nil {
			if cerr := d.Close(); cerr != nil {
				log.Warn("closing the log", "err", cerr)
			}
		} else {
			m.Close()
		}
		if s.cfg.Released != nil {
			mctx, cancel := context.WithTimeout(context.Background(), s.cfg.TTL)
			if merr := s.cfg.Released(mctx, term); merr != nil {
				log.Warn("writing the released marker", "err", merr)
			}
			cancel()
		}
		// After the log is closed: nothing is written once a standby may
		// claim it. A released view lets a standby take over at once.
		rctx, cancel := context.WithTimeout(context.Background(), s.cfg.TTL)
		if rerr := sess.Release(rctx); rerr != nil && !errors.Is(rerr, leader.ErrClosed) {
			log.Warn("releasing leadership", "err", rerr)
		}
		cancel()
		c.Close()
	}()

	wctx, cancel := context.WithTimeout(ctx, s.cfg.TTL+10*time.Second)
	defer cancel()
	warm := s.needWarmup(wctx, rd)
	// Claim the log: from here a deposed leader's appends are fenced.
	st, err := s.cfg.OpenLog(wctx, term)
	if err != nil {
		return fmt.Errorf("claim the log with term %d: %w", term, err)
	}
	_, seq, err := f.Handover(wctx)
	if err != nil {
		st.Close()
		return fmt.Errorf("final catch-up: %w", err)
	}
	last, err := st.LastSeq(wctx)
	if err == nil && last != seq {
		err = fmt.Errorf("the claimed log ends at seq %d, the replica at %d", last, seq)
	}
	if err != nil {
		st.Close()
		return err
	}
	sink, err := oplog.NewSink(wctx, st, oplog.SinkConfig{Term: term})
	if err != nil {
		st.Close()
		return err
	}
	fw.s.Store(sink)
	d = &oplog.Durable{Master: m, Sink: sink, Store: st}
	s.mu.Lock()
	s.dur = d
	s.mu.Unlock()
	log.Info("candidate: caught up", "seq", seq)

	// Warm-up: any old leader has stopped answering at its deadline,
	// before its lease expired and we could acquire; Warmup (default one
	// TTL) covers clock rates and its stop.
	if warm {
		s.setRole(Warmup, term)
		wait := time.NewTimer(time.Until(acquired.Add(cmp.Or(s.cfg.Warmup, s.cfg.TTL))))
		defer wait.Stop()
		select {
		case <-ctx.Done():
			return nil
		case <-sess.Lost():
			return fmt.Errorf("lost leadership during warm-up: %w", sess.Err())
		case <-wait.C:
		}
	} else {
		log.Info("candidate: the last leader released the log; no warm-up")
	}
	if err := sess.Err(); err != nil {
		return fmt.Errorf("lost leadership before serving: %w", err)
	}
	if err := m.Start(); err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	leader.Monitor(sess, func(reason error) {
		if sctx.Err() == nil && !errors.Is(reason, leader.ErrClosed) {
			log.Error("leadership lost: stopping the server", "reason", reason)
		}
		stop()
	})
	s.setRole(Leader, term)
	took := time.Since(acquired)
	s.timeToServ.Store(int64(took))
	log.Info("leader: serving", "time_to_serve", took, "seq", seq)
	// A failed log (fenced by a newer term, or etcd unreachable past its
	// write timeout) acknowledges nothing more: step down, so that a
	// standby with a fresh store can take over.
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		t := time.NewTicker(max(s.cfg.TTL/4, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if ferr := d.Failed(); ferr != nil {
					log.Error("operation log failed: stepping down", "err", ferr)
					stop()
					return
				}
			}
		}
	}()
	lease := func() error {
		if err := sess.Err(); err != nil {
			return err
		}
		if dl := sess.Deadline(); !time.Now().Before(dl) {
			return fmt.Errorf("leadership lease ended at %s (no renewal confirmed)", dl.Format(time.RFC3339Nano))
		}
		return nil
	}
	serr := s.cfg.Serve(sctx, d, lease)
	stop()
	<-watched
	if ctx.Err() != nil {
		log.Info("leader: stopping (shutdown)")
		return nil
	}
	if serr != nil {
		return fmt.Errorf("serve: %w", serr)
	}
	if e := sess.Err(); e != nil {
		return fmt.Errorf("leadership lost: %w", e)
	}
	if e := d.Failed(); e != nil {
		return fmt.Errorf("operation log failed: %w", e)
	}
	return errors.New("serve returned")
}
