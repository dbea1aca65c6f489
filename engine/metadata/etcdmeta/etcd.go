package etcdmeta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/internal/logx"
)

// ErrClosed is returned by a closed backend.
var ErrClosed = errors.New("etcdmeta: backend closed")

func init() {
	metadata.Register("etcd", func(conn string, opts metadata.Options) (metadata.Backend, error) {
		return Open(conn, opts)
	})
}

// ParseEndpoints returns the etcd endpoints ("host:port") of a connection
// string: "etcd://h:p[,h2:p2]" or a bare "h:p[,h2:p2]" (';' also
// separates, as some reference deployments write it).
func ParseEndpoints(conn string) ([]string, error) {
	rest := conn
	if i := strings.Index(conn, "://"); i >= 0 {
		if conn[:i] != "etcd" {
			return nil, fmt.Errorf("%w: %q: scheme is not etcd", metadata.ErrBadConnString, conn)
		}
		rest = conn[i+3:]
	}
	rest = strings.TrimSuffix(rest, "/")
	if rest == "" {
		return nil, fmt.Errorf("%w: %q: no etcd endpoint", metadata.ErrBadConnString, conn)
	}
	var eps []string
	for _, ep := range strings.Split(strings.ReplaceAll(rest, ";", ","), ",") {
		ep = strings.TrimSpace(ep)
		host, ps, err := net.SplitHostPort(ep)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: endpoint %q: %w", metadata.ErrBadConnString, conn, ep, err)
		}
		if p, err := strconv.Atoi(ps); err != nil || p <= 0 || p > 65535 || host == "" || strings.ContainsAny(host, "/@?#") {
			return nil, fmt.Errorf("%w: %q: endpoint %q is not host:port", metadata.ErrBadConnString, conn, ep)
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("%w: %q: no etcd endpoint", metadata.ErrBadConnString, conn)
	}
	return eps, nil
}

// Backend keeps segment descriptors in etcd. Entries it publishes are
// attached to one lease that it keeps alive; Close revokes the lease.
type Backend struct {
	cli  *clientv3.Client
	opts metadata.Options
	keys metadata.Keys
	eps  []string

	ctx    context.Context // ends at Close: keep-alives and watches
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex // serialises writes and lease changes
	closed bool
	lease  clientv3.LeaseID // 0: none granted yet (or lost)
	owned  map[string][]byte
}

var _ metadata.Watcher = (*Backend)(nil)

// Open connects to etcd and checks that it answers within opts.Timeout.
// Options are expected to carry metadata.Open's defaults.
func Open(conn string, opts metadata.Options) (*Backend, error) {
	eps, err := ParseEndpoints(conn)
	if err != nil {
		return nil, err
	}
	if opts.Timeout <= 0 || opts.TTL <= 0 || opts.PollInterval <= 0 || opts.Logger == nil {
		return nil, fmt.Errorf("etcdmeta: options lack defaults (open through metadata.Open)")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: opts.Timeout,
		// Dead connections are noticed within a TTL, so keep-alives of
		// the lease are not silently lost.
		DialKeepAliveTime:    max(opts.TTL/2, time.Second),
		DialKeepAliveTimeout: max(opts.TTL/2, time.Second),
		// A response past this is refused from its length, before it
		// is read (etcd's client would take up to 2 GiB).
		MaxCallRecvMsgSize: maxReply,
		Logger:             logx.Zap(opts.Logger, "etcd"),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: etcd %v: %w", metadata.ErrUnavailable, eps, err)
	}
	b := &Backend{cli: cli, opts: opts, keys: metadata.NewKeys(opts.ClusterID), eps: eps, owned: map[string][]byte{}}
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()
	if _, err := cli.Get(ctx, b.keys.Prefix, clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w (%s)", b.wrap("connect", err), metadata.DialDiagnosis(eps...))
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b, nil
}

// Keys returns the key names the backend uses.
func (b *Backend) Keys() metadata.Keys { return b.keys }

// wrap reports a client error with the endpoints; timeouts and
// unreachable servers also match metadata.ErrUnavailable.
func (b *Backend) wrap(op string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, rpctypes.ErrTimeout) {
		return fmt.Errorf("etcdmeta: %s (etcd %s): %w: %w", op, strings.Join(b.eps, ","), metadata.ErrUnavailable, err)
	}
	return fmt.Errorf("etcdmeta: %s (etcd %s): %w", op, strings.Join(b.eps, ","), err)
}

func (b *Backend) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.opts.Timeout)
}

func (b *Backend) ttlSeconds() int64 {
	s := int64((b.opts.TTL + time.Second - 1) / time.Second)
	return max(s, 1)
}

// Publish writes d under its segment key, and the rpc_meta entry when
// Options.RPCAddr is set, both attached to the backend's lease.
func (b *Backend) Publish(ctx context.Context, d *metadata.SegmentDesc) error {
	kvs, err := b.keys.Entries(d, b.opts.RPCAddr)
	if err != nil {
		return err
	}
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	for attempt := 0; ; attempt++ {
		err := b.putLocked(ctx, kvs)
		if err == nil {
			break
		}
		if attempt == 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) {
			b.lease = 0 // expired under us: grant another
			continue
		}
		return b.wrap("publish "+d.Name, err)
	}
	for k, v := range kvs {
		b.owned[k] = v
	}
	return nil
}

// putLocked writes kvs atomically under the lease, granting it first if
// needed.
func (b *Backend) putLocked(ctx context.Context, kvs map[string][]byte) error {
	if b.lease == 0 {
		resp, err := b.cli.Grant(ctx, b.ttlSeconds())
		if err != nil {
			return err
		}
		b.lease = resp.ID
		b.wg.Add(1)
		go b.keepAlive(resp.ID)
	}
	ops := make([]clientv3.Op, 0, len(kvs))
	for k, v := range kvs {
		ops = append(ops, clientv3.OpPut(k, string(v), clientv3.WithLease(b.lease)))
	}
	_, err := b.cli.Txn(ctx).Then(ops...).Commit()
	return err
}

// keepAlive keeps lease id alive until Close. When the lease is lost (the
// store was unreachable for longer than the TTL), everything owned is
// published again under a new lease.
func (b *Backend) keepAlive(id clientv3.LeaseID) {
	defer b.wg.Done()
	ch, err := b.cli.KeepAlive(b.ctx, id)
	if err == nil {
		for range ch {
		}
	}
	if b.ctx.Err() != nil {
		return
	}
	b.opts.Logger.Warn("etcdmeta: lease lost; publishing again", "lease", int64(id), "err", err)
	delay := 100 * time.Millisecond
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return
		}
		if b.lease == id {
			b.lease = 0
		}
		if b.lease != 0 || len(b.owned) == 0 {
			// Another lease (with its own keep-alive) took over, or
			// nothing is left to keep.
			b.mu.Unlock()
			return
		}
		ctx, cancel := b.opCtx(b.ctx)
		err := b.putLocked(ctx, b.owned)
		cancel()
		b.mu.Unlock()
		if err == nil {
			return
		}
		b.opts.Logger.Warn("etcdmeta: publishing again failed", "err", err)
		select {
		case <-b.ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(delay*2, b.opts.TTL)
	}
}

// Get returns segment name's descriptor, or an error matching
// metadata.ErrNotFound when there is none.
func (b *Backend) Get(ctx context.Context, name string) (*metadata.SegmentDesc, error) {
	return b.keys.GetDesc(ctx, b.get, "etcd", name)
}

func (b *Backend) get(ctx context.Context, key string) ([]byte, bool, error) {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	resp, err := b.cli.Get(ctx, key)
	if status.Code(err) == codes.ResourceExhausted {
		return nil, false, fmt.Errorf("%w: etcd key %s holds more than %d bytes", metadata.ErrBadDescriptor, key, maxReply)
	}
	if err != nil {
		return nil, false, b.wrap("get "+key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false, nil
	}
	return resp.Kvs[0].Value, true, nil
}

// maxReply bounds one etcd response: a descriptor of MaxDescBytes and
// what surrounds it (a variable for tests).
var maxReply = metadata.MaxDescBytes + 1<<20

// RPCAddr returns the handshake address published under
// rpc_meta/<name>.
func (b *Backend) RPCAddr(ctx context.Context, name string) (string, error) {
	return b.keys.GetRPCAddr(ctx, b.get, "etcd", name)
}

// Remove deletes segment name's descriptor and rpc_meta entry.
func (b *Backend) Remove(ctx context.Context, name string) error {
	keys := []string{b.keys.Segment(name), b.keys.RPCMeta(name)}
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpDelete(k)
		delete(b.owned, k)
	}
	if _, err := b.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return b.wrap("remove "+name, err)
	}
	return nil
}

// Watch reports segment name's descriptor and its changes, from an etcd
// watch (no polling). See metadata.Watcher.
func (b *Backend) Watch(ctx context.Context, name string, fn func(*metadata.SegmentDesc)) error {
	key := b.keys.Segment(name)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(b.ctx, cancel)
	defer stop()

	var last []byte
	delivered := false
	deliver := func(v []byte) {
		if delivered && bytes.Equal(v, last) && (v == nil) == (last == nil) {
			return
		}
		var d *metadata.SegmentDesc
		if v != nil {
			var err error
			if d, err = metadata.UnmarshalDesc(v); err != nil {
				b.opts.Logger.Warn("etcdmeta: watched descriptor is invalid; ignored", "key", key, "err", err)
				return
			}
			metadata.FillDataHost(d, func() (string, error) { return b.RPCAddr(ctx, name) })
		}
		last, delivered = v, true
		fn(d)
	}
	done := func() error {
		if b.ctx.Err() != nil {
			return ErrClosed
		}
		return ctx.Err()
	}
	for {
		// Read the current value, then watch from the next revision, so
		// no change between the two is missed.
		gctx, gcancel := b.opCtx(ctx)
		resp, err := b.cli.Get(gctx, key)
		gcancel()
		if err != nil {
			if ctx.Err() != nil {
				return done()
			}
			b.opts.Logger.Debug("etcdmeta: watch read failed; retrying", "key", key, "err", err)
			select {
			case <-ctx.Done():
				return done()
			case <-time.After(b.opts.PollInterval):
			}
			continue
		}
		if len(resp.Kvs) == 0 {
			deliver(nil)
		} else {
			deliver(resp.Kvs[0].Value)
		}
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range b.cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break // compacted, cancelled or leader lost: read again
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					deliver(nil)
				} else {
					deliver(ev.Kv.Value)
				}
			}
		}
		wcancel()
		if ctx.Err() != nil {
			return done()
		}
		select {
		case <-ctx.Done():
			return done()
		case <-time.After(b.opts.PollInterval):
		}
	}
}

// Close revokes the lease (so everything this backend published
// disappears at once), stops keep-alives and watches, and disconnects.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	lease := b.lease
	b.lease = 0
	clear(b.owned)
	b.mu.Unlock()
	b.cancel()
	var err error
	if lease != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
		if _, rerr := b.cli.Revoke(ctx, lease); rerr != nil && !errors.Is(rerr, rpctypes.ErrLeaseNotFound) {
			err = b.wrap("revoke lease", rerr)
		}
		cancel()
	}
	b.wg.Wait()
	return errors.Join(err, b.cli.Close())
}
