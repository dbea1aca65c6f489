package leader

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/crescent-kv/crescent/internal/logx"
)

// Dial keep-alives: a hung etcd member (accepting connections but not
// answering) is noticed within about their sum and the client moves on.
const (
	etcdDialTimeout          = 5 * time.Second
	etcdDialKeepAliveTime    = 2 * time.Second
	etcdDialKeepAliveTimeout = 2 * time.Second
	// etcdRetryPause spaces re-reads after a broken watch.
	etcdRetryPause = 100 * time.Millisecond
	// etcdMaxRecv bounds one etcd response (the client's default is 2
	// GiB): a view is a short address, and a watch response of many
	// changes stays far below this.
	etcdMaxRecv = 1 << 20
)

// EtcdClientConfig is the client configuration the coordinator expects:
// the endpoints with dial keep-alives on, so a hung etcd leader does not
// leave the view stale.
func EtcdClientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          etcdDialTimeout,
		DialKeepAliveTime:    etcdDialKeepAliveTime,
		DialKeepAliveTimeout: etcdDialKeepAliveTimeout,
		PermitWithoutStream:  true,
		MaxCallRecvMsgSize:   etcdMaxRecv,
		Logger:               logx.Zap(nil, "etcd"), // slog.Default()
	}
}

// Etcd is the etcd Coordinator.
type Etcd struct {
	cli       *clientv3.Client
	clusterID string
	key       string
	ttl       int64 // seconds
	reg       registry
}

var _ Coordinator = (*Etcd)(nil)

// NewEtcd returns a coordinator on cli (see EtcdClientConfig) for
// clusterID. cli stays the caller's to close, after the coordinator.
func NewEtcd(cli *clientv3.Client, clusterID string, opts ...Option) (*Etcd, error) {
	if cli == nil {
		return nil, fmt.Errorf("%w: nil etcd client", ErrInvalid)
	}
	o, err := buildOptions(clusterID, opts)
	if err != nil {
		return nil, err
	}
	if o.minSet {
		return nil, fmt.Errorf("%w: WithMinTerm is for Redis; etcd revisions never go back", ErrInvalid)
	}
	return &Etcd{cli: cli, clusterID: clusterID, key: EtcdKey(o.prefix, clusterID), ttl: int64(math.Ceil(o.ttl.Seconds()))}, nil
}

// EtcdKey is the view key: <prefix>/<clusterID>/master_view.
func EtcdKey(prefix, clusterID string) string { return prefix + "/" + clusterID + "/master_view" }

// View reads the key.
func (c *Etcd) View(ctx context.Context) (View, error) {
	v, _, err := c.read(ctx)
	return v, err
}

// read returns the view and the revision it was read at.
func (c *Etcd) read(ctx context.Context) (View, int64, error) {
	resp, err := c.cli.Get(ctx, c.key)
	if err != nil {
		return View{}, 0, fmt.Errorf("leader: etcd read view: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return View{}, resp.Header.Revision, nil
	}
	kv := resp.Kvs[0]
	if err := checkView(len(kv.Value)); err != nil {
		return View{}, 0, err
	}
	return View{Leader: string(kv.Value), Version: uint64(kv.CreateRevision)}, resp.Header.Revision, nil
}

// TryAcquire grants a lease and puts the key under it if absent.
func (c *Etcd) TryAcquire(ctx context.Context, addr string) (Session, View, error) {
	if err := checkAddr(addr); err != nil {
		return nil, View{}, err
	}
	if c.reg.isClosed() {
		return nil, View{}, ErrClosed
	}
	granted := time.Now() // the lease cannot expire before granted+TTL
	lease, err := c.cli.Grant(ctx, c.ttl)
	if err != nil {
		return nil, View{}, fmt.Errorf("leader: etcd grant: %w", err)
	}
	revoke := func() {
		rctx, cancel := context.WithTimeout(context.Background(), etcdDialTimeout)
		c.cli.Revoke(rctx, lease.ID)
		cancel()
	}
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(c.key), "=", 0)).
		Then(clientv3.OpPut(c.key, addr, clientv3.WithLease(lease.ID))).
		Else(clientv3.OpGet(c.key)).
		Commit()
	if err != nil {
		revoke()
		return nil, View{}, fmt.Errorf("leader: etcd acquire: %w", err)
	}
	if !resp.Succeeded {
		revoke()
		var v View
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			if err := checkView(len(kvs[0].Value)); err != nil {
				return nil, View{}, err
			}
			v = View{Leader: string(kvs[0].Value), Version: uint64(kvs[0].CreateRevision)}
		}
		return nil, v, nil
	}
	// The put is the transaction's only write: the key's create revision
	// is the transaction's revision.
	term := resp.Header.Revision
	s := &etcdSession{c: c, ending: newEnding(), lease: lease.ID, ttl: lease.TTL, rev: term, done: make(chan struct{})}
	s.extend(granted.Add(time.Duration(lease.TTL) * time.Second))
	sctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if !c.reg.add(s) {
		cancel()
		revoke()
		return nil, View{}, ErrClosed
	}
	go s.run(sctx)
	return s, View{Leader: addr, Version: uint64(term)}, nil
}

// WaitChange watches the key (requiring an etcd leader, so a partitioned
// member does not hold the watch silently) and re-reads it whenever the
// watch breaks.
func (c *Etcd) WaitChange(ctx context.Context, after uint64) (View, error) {
	for {
		v, rev, err := c.read(ctx)
		if err == nil && v.Version != after {
			return v, nil
		}
		if ctx.Err() != nil {
			return View{}, ctx.Err()
		}
		if err == nil {
			if v, ok := c.watch(ctx, after, rev); ok {
				return v, nil
			}
		}
		select {
		case <-ctx.Done():
			return View{}, ctx.Err()
		case <-time.After(etcdRetryPause):
		}
	}
}

// watch waits from rev+1 for a view with another version; false when
// the watch broke or ctx ended. Its context is cancelled on return so
// the client's watch stream goes away.
func (c *Etcd) watch(ctx context.Context, after uint64, rev int64) (View, bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range c.cli.Watch(wctx, c.key, clientv3.WithRev(rev+1)) {
		if resp.Err() != nil || resp.Canceled {
			return View{}, false
		}
		for _, ev := range resp.Events {
			var v View
			if ev.Type == clientv3.EventTypePut {
				if checkView(len(ev.Kv.Value)) != nil {
					return View{}, false // the re-read reports it
				}
				v = View{Leader: string(ev.Kv.Value), Version: uint64(ev.Kv.CreateRevision)}
			}
			if v.Version != after {
				return v, true
			}
		}
	}
	return View{}, false
}

// Close ends every live session with ErrClosed.
func (c *Etcd) Close() error {
	c.reg.closeAll()
	return nil
}

type etcdSession struct {
	c *Etcd
	ending
	leaseClock
	lease  clientv3.LeaseID
	rev    int64 // the key's create revision: the term
	ttl    int64 // granted, seconds
	cancel context.CancelFunc
	done   chan struct{}
	rel    sync.Once
}

func (s *etcdSession) Term() uint64 { return uint64(s.rev) }

// run renews the lease every TTL/3 with single keep-alives (so each
// confirmed renewal's send time is known: the deadline) and follows the
// key. A confirmed loss (lease gone, key deleted or replaced) or the
// deadline passing without a confirmed renewal ends the session.
func (s *etcdSession) run(ctx context.Context) {
	defer close(s.done)
	defer s.c.reg.remove(s)
	// The watch is opened beside this loop: opening one waits for the
	// stream, which a partition holds until ctx ends, and the loop must
	// keep reaching the deadline.
	armed := make(chan clientv3.WatchChan, 1)
	arm := func() { armed <- s.watchKey(ctx) }
	go arm()
	var wch clientv3.WatchChan
	var rearm <-chan time.Time
	ttl := time.Duration(s.ttl) * time.Second
	renew := time.NewTimer(ttl / 3)
	defer renew.Stop()
	expire := time.NewTimer(time.Until(s.Deadline()))
	defer expire.Stop()
	for {
		select {
		case <-rearm:
			rearm = nil
			go arm()
		case wch = <-armed:
		case <-renew.C:
			err := s.keepAlive(ctx)
			switch {
			case err == nil:
				expire.Reset(time.Until(s.Deadline()))
				renew.Reset(ttl / 3)
			case errors.Is(err, ErrLeadershipLost), errors.Is(err, ErrClosed):
				s.end(err)
				s.cancel()
				return
			default: // unreachable for now: try again soon, the deadline decides
				renew.Reset(etcdRetryPause)
			}
		case <-expire.C:
			if ctx.Err() != nil {
				s.end(ErrClosed)
				return
			}
			s.end(fmt.Errorf("%w: no renewal confirmed within the lease TTL (%v)", ErrRenew, ttl))
			s.cancel()
			return
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil || resp.Canceled {
				// A broken watch (no etcd leader, ctx end) proves nothing:
				// the renewals decide. Re-arm it unless we are ending.
				if ctx.Err() != nil {
					s.end(ErrClosed)
					return
				}
				wch, rearm = nil, time.After(etcdRetryPause)
				continue
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != s.rev {
					s.end(fmt.Errorf("%w: view key deleted or replaced", ErrLeadershipLost))
					s.cancel()
					return
				}
			}
		}
	}
}

// keepAlive renews the lease once, bounded by the deadline, and extends
// the deadline from the send time by the TTL etcd confirms.
func (s *etcdSession) keepAlive(ctx context.Context) error {
	sent := time.Now()
	kctx, cancel := context.WithDeadline(ctx, s.Deadline())
	defer cancel()
	resp, err := s.c.cli.KeepAliveOnce(kctx, s.lease)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound), err == nil && resp.TTL <= 0:
		return fmt.Errorf("%w: lease %x expired or revoked", ErrLeadershipLost, int64(s.lease))
	case err != nil && ctx.Err() != nil:
		return ErrClosed
	case err != nil:
		return fmt.Errorf("%w: %v", ErrRenew, err)
	}
	s.extend(sent.Add(time.Duration(resp.TTL) * time.Second))
	return nil
}

// watchKey watches our key from its creation; a watch whose context is
// done closes at once.
func (s *etcdSession) watchKey(ctx context.Context) clientv3.WatchChan {
	return s.c.cli.Watch(clientv3.WithRequireLeader(ctx), s.c.key, clientv3.WithRev(s.rev+1))
}

// Renew sends one keep-alive now; a lease found gone ends the session.
func (s *etcdSession) Renew(ctx context.Context) error {
	if err := s.Err(); err != nil {
		return err
	}
	err := s.keepAlive(ctx)
	switch {
	case errors.Is(err, ErrClosed) && ctx.Err() != nil: // the caller's ctx, not ours
		return fmt.Errorf("%w: %v", ErrRenew, ctx.Err())
	case errors.Is(err, ErrLeadershipLost):
		s.end(err)
		s.cancel()
	}
	return err
}

func (s *etcdSession) close() {
	s.end(ErrClosed)
	s.cancel()
	<-s.done
}

// Release ends the session, deletes the key if it is still ours and
// revokes the lease.
func (s *etcdSession) Release(ctx context.Context) error {
	s.close()
	var err error
	s.rel.Do(func() {
		_, terr := s.c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(s.c.key), "=", s.rev)).
			Then(clientv3.OpDelete(s.c.key)).
			Commit()
		_, rerr := s.c.cli.Revoke(ctx, s.lease)
		if errors.Is(rerr, rpctypes.ErrLeaseNotFound) {
			rerr = nil
		}
		err = errors.Join(terr, rerr)
		if err != nil {
			err = fmt.Errorf("leader: etcd release: %w", err)
		}
	})
	return err
}
