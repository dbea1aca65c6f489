package redismeta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/crescent-kv/crescent/engine/metadata"
)

// ErrClosed is returned by a closed backend.
var ErrClosed = errors.New("redismeta: backend closed")

// Environment variables the reference reads for Redis credentials and
// database; values in the connection string take precedence.
const (
	PasswordEnv = "MC_REDIS_PASSWORD"
	UsernameEnv = "MC_REDIS_USERNAME"
	DBIndexEnv  = "MC_REDIS_DB_INDEX"
)

func init() {
	open := func(conn string, opts metadata.Options) (metadata.Backend, error) { return Open(conn, opts) }
	metadata.Register("redis", open)
	metadata.Register("rediss", open)
}

// ParseConn parses "redis://[user:password@]host[:port][/db]" (or
// rediss:// for TLS) into client options. Credentials and db missing from
// the string come from MC_REDIS_USERNAME, MC_REDIS_PASSWORD and
// MC_REDIS_DB_INDEX.
func ParseConn(conn string) (*redis.Options, error) {
	u, err := url.Parse(conn)
	if err != nil {
		// url.Error repeats the string, password included: keep only
		// the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w: not a URL: %w", metadata.ErrBadConnString, err)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("%w: %q: scheme is not redis or rediss", metadata.ErrBadConnString, metadata.Redact(conn))
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("%w: %q: no host", metadata.ErrBadConnString, metadata.Redact(conn))
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("%w: %q: bad port", metadata.ErrBadConnString, metadata.Redact(conn))
		}
	}
	o, err := redis.ParseURL(conn)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", metadata.ErrBadConnString, metadata.Redact(conn), err)
	}
	if u.User == nil {
		o.Username = os.Getenv(UsernameEnv)
		o.Password = os.Getenv(PasswordEnv)
	}
	if strings.Trim(u.Path, "/") == "" {
		if s := strings.TrimSpace(os.Getenv(DBIndexEnv)); s != "" {
			db, err := strconv.Atoi(s)
			if err != nil || db < 0 || db > 255 {
				return nil, fmt.Errorf("%w: %s=%q is not a database index 0-255", metadata.ErrBadConnString, DBIndexEnv, s)
			}
			o.DB = db
		}
	}
	return o, nil
}

// Backend keeps segment descriptors in Redis. Entries it publishes are
// SET with PX (Options.TTL) and refreshed every TTL/3 while it runs;
// Close deletes them.
type Backend struct {
	cli  *redis.Client
	opts metadata.Options
	keys metadata.Keys
	addr string
	db   int

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex // serialises writes and refreshes
	closed bool
	owned  map[string][]byte

	w watchHub
}

var _ metadata.Watcher = (*Backend)(nil)

// Open connects to Redis and checks that it answers within opts.Timeout.
// Options are expected to carry metadata.Open's defaults.
func Open(conn string, opts metadata.Options) (*Backend, error) {
	o, err := ParseConn(conn)
	if err != nil {
		return nil, err
	}
	if opts.Timeout <= 0 || opts.TTL <= 0 || opts.PollInterval <= 0 || opts.Logger == nil {
		return nil, fmt.Errorf("redismeta: options lack defaults (open through metadata.Open)")
	}
	if opts.TTL < 3*time.Millisecond {
		return nil, fmt.Errorf("redismeta: TTL %v too short", opts.TTL)
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = opts.Timeout, opts.Timeout, opts.Timeout, opts.Timeout
	o.ContextTimeoutEnabled = true
	b := &Backend{
		cli: redis.NewClient(o), opts: opts, keys: metadata.NewKeys(opts.ClusterID),
		addr: o.Addr, db: o.DB, owned: map[string][]byte{},
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()
	if err := b.cli.Ping(ctx).Err(); err != nil {
		b.cli.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w (%s)", b.wrap("connect", err), metadata.DialDiagnosis(o.Addr))
		}
		return nil, b.wrap("connect", err)
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.w.init(b)
	b.wg.Add(1)
	go b.refreshLoop()
	return b, nil
}

// Keys returns the key names the backend uses.
func (b *Backend) Keys() metadata.Keys { return b.keys }

func (b *Backend) wrap(op string, err error) error {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		(errors.As(err, &ne) && ne.Timeout()) || isDialError(err) {
		return fmt.Errorf("redismeta: %s (redis %s db %d): %w: %w", op, b.addr, b.db, metadata.ErrUnavailable, err)
	}
	return fmt.Errorf("redismeta: %s (redis %s db %d): %w", op, b.addr, b.db, err)
}

func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

func (b *Backend) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.opts.Timeout)
}

// Publish SETs d under its segment key, and the rpc_meta entry when
// Options.RPCAddr is set, in one transaction, each with PX = TTL.
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
	_, err = b.cli.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for k, v := range kvs {
			p.Set(ctx, k, v, b.opts.TTL)
		}
		return nil
	})
	if err != nil {
		return b.wrap("publish "+d.Name, err)
	}
	for k, v := range kvs {
		b.owned[k] = v
	}
	return nil
}

// refreshLoop extends the TTL of owned entries every TTL/3. An entry that
// expired anyway (Redis unreachable for longer than the TTL) is SET
// again.
func (b *Backend) refreshLoop() {
	defer b.wg.Done()
	tick := time.NewTicker(max(b.opts.TTL/3, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-tick.C:
		}
		if err := b.refresh(); err != nil && b.ctx.Err() == nil {
			b.opts.Logger.Warn("redismeta: refreshing published entries failed", "err", err)
		}
	}
}

func (b *Backend) refresh() error {
	// Held across the round trip so that a concurrent Remove cannot be
	// undone by a refresh that SETs the key again.
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || len(b.owned) == 0 {
		return nil
	}
	ctx, cancel := b.opCtx(b.ctx)
	defer cancel()
	keys := make([]string, 0, len(b.owned))
	cmds := make([]*redis.BoolCmd, 0, len(b.owned))
	_, err := b.cli.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k := range b.owned {
			keys = append(keys, k)
			cmds = append(cmds, p.PExpire(ctx, k, b.opts.TTL))
		}
		return nil
	})
	if err != nil {
		return b.wrap("refresh", err)
	}
	var lost []string
	for i, c := range cmds {
		if !c.Val() {
			lost = append(lost, keys[i])
		}
	}
	if len(lost) == 0 {
		return nil
	}
	b.opts.Logger.Warn("redismeta: published entries expired; publishing again", "keys", lost)
	_, err = b.cli.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range lost {
			p.Set(ctx, k, b.owned[k], b.opts.TTL)
		}
		return nil
	})
	if err != nil {
		return b.wrap("publish again", err)
	}
	return nil
}

// Get returns segment name's descriptor, or an error matching
// metadata.ErrNotFound when there is none.
func (b *Backend) Get(ctx context.Context, name string) (*metadata.SegmentDesc, error) {
	return b.keys.GetDesc(ctx, b.get, "redis", name)
}

// get reads key's value, at most metadata.MaxDescBytes of it: anyone
// with access to the store may have written it, and Redis takes values
// of up to 512 MB. One byte more is read to tell a value over the bound.
func (b *Backend) get(ctx context.Context, key string) ([]byte, bool, error) {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	var exists *redis.IntCmd
	var val *redis.StringCmd
	_, err := b.cli.TxPipelined(ctx, func(p redis.Pipeliner) error {
		exists = p.Exists(ctx, key)
		val = p.GetRange(ctx, key, 0, metadata.MaxDescBytes)
		return nil
	})
	if err != nil {
		return nil, false, b.wrap("get "+key, err)
	}
	if exists.Val() == 0 {
		return nil, false, nil
	}
	v, err := val.Bytes()
	if err != nil {
		return nil, false, b.wrap("get "+key, err)
	}
	if len(v) > metadata.MaxDescBytes {
		return nil, false, fmt.Errorf("%w: redis key %s holds more than %d bytes", metadata.ErrBadDescriptor, key, metadata.MaxDescBytes)
	}
	return v, true, nil
}

// RPCAddr returns the handshake address published under
// rpc_meta/<name>.
func (b *Backend) RPCAddr(ctx context.Context, name string) (string, error) {
	return b.keys.GetRPCAddr(ctx, b.get, "redis", name)
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
	for _, k := range keys {
		delete(b.owned, k)
	}
	if err := b.cli.Del(ctx, keys...).Err(); err != nil {
		return b.wrap("remove "+name, err)
	}
	return nil
}

// Close deletes the entries this backend still owns, stops refreshing and
// watching, and disconnects.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	keys := make([]string, 0, len(b.owned))
	for k := range b.owned {
		keys = append(keys, k)
	}
	clear(b.owned)
	b.mu.Unlock()
	b.cancel()
	var err error
	if len(keys) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
		if derr := b.cli.Del(ctx, keys...).Err(); derr != nil {
			err = b.wrap("remove on close", derr)
		}
		cancel()
	}
	b.w.close()
	b.wg.Wait()
	return errors.Join(err, b.cli.Close())
}

// sameValue reports whether two GET results (nil = absent) are equal.
func sameValue(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }
