package ha

import (
	"context"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdNotifier watches the durable prefix key, which every append
// rewrites. The watch requires a leader (a member cut off from its
// cluster ends it instead of going silent) and is re-established with
// backoff after any error, a compaction of the watched revision or the
// channel closing; each watch has its own context, cancelled before the
// next starts, so no watcher goroutine of the client outlives it.
type etcdNotifier struct {
	base
	cli  *clientv3.Client
	key  string
	opts NotifyOptions

	rearms atomic.Uint64
}

func newEtcdNotifier(cli *clientv3.Client, key string, opts NotifyOptions) *etcdNotifier {
	n := &etcdNotifier{base: newBase(), cli: cli, key: key, opts: opts}
	go n.run()
	return n
}

// Rearms counts the watches established after the first.
func (n *etcdNotifier) Rearms() uint64 { return n.rearms.Load() }

func (n *etcdNotifier) run() {
	defer close(n.done)
	rev := n.opts.startRev
	backoff := n.opts.RetryMin
	for first := true; ; first = false {
		if !first {
			n.rearms.Add(1)
		}
		var ok bool
		rev, ok = n.watch(rev)
		if ok {
			backoff = n.opts.RetryMin
		}
		select {
		case <-n.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, n.opts.RetryMax)
	}
}

// watch runs one watch from revision rev (0: from now, after a read of
// the key) until it ends; it returns the revision to resume from (0
// when it must start afresh) and whether it saw a healthy response.
func (n *etcdNotifier) watch(rev int64) (int64, bool) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(n.ctx))
	defer cancel()
	if rev == 0 {
		// Anything may have been appended while no watch ran.
		resp, err := n.cli.Get(ctx, n.key, clientv3.WithKeysOnly())
		if err != nil {
			return 0, false
		}
		rev = resp.Header.Revision + 1
		n.fire()
	}
	healthy := false
	for resp := range n.cli.Watch(ctx, n.key, clientv3.WithRev(rev)) {
		if resp.CompactRevision != 0 {
			n.fire() // what was missed is in the store
			return 0, healthy
		}
		if err := resp.Err(); err != nil {
			n.fire()
			return 0, healthy
		}
		healthy = true
		if len(resp.Events) > 0 {
			n.fire()
		}
		if resp.Header.Revision >= rev {
			rev = resp.Header.Revision + 1
		}
	}
	// Closed: the client was closed, ctx ended, or the stream broke.
	if n.ctx.Err() == nil {
		n.fire()
	}
	return rev, healthy
}
