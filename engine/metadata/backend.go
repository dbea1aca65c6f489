package metadata

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// P2PHandshake is the connection string for peer-to-peer descriptor
// exchange: no store; a segment's name is its handshake "host:port".
const P2PHandshake = "P2PHANDSHAKE"

// Backend is where segment descriptors are published and found.
type Backend interface {
	// Publish makes the local descriptor visible (a no-op for P2P, where
	// peers ask the handshake server).
	Publish(ctx context.Context, d *SegmentDesc) error
	// Get returns the descriptor of segment name.
	Get(ctx context.Context, name string) (*SegmentDesc, error)
	// Remove withdraws segment name.
	Remove(ctx context.Context, name string) error
	// RPCAddr returns the handshake address of segment name.
	RPCAddr(ctx context.Context, name string) (string, error)
	Close() error
}

// Watcher is implemented by backends that report descriptor changes
// (etcd watch, Redis keyspace notifications or polling).
type Watcher interface {
	// Watch calls fn with the current descriptor of segment name, then
	// after every change, and with nil while the segment is absent
	// (removed, or its owner's lease expired). Calls are serial and in
	// order; identical consecutive values may be skipped. Watch blocks
	// until ctx ends (returning ctx.Err()) or the backend is closed.
	Watch(ctx context.Context, name string, fn func(*SegmentDesc)) error
}

// Options configure a backend.
type Options struct {
	// Timeout bounds each backend operation (default 5s).
	Timeout time.Duration
	// Self returns the local descriptor; P2P requests carry it.
	Self func() *SegmentDesc
	// ClusterID namespaces the keys of store backends:
	// "mooncake/<ClusterID>/..." (default: $MC_METADATA_CLUSTER_ID).
	ClusterID string
	// RPCAddr is the local handshake address ("host:port"). When set,
	// store backends publish it as rpc_meta/<segment> with the
	// descriptor, so peers can reach the handshake server by name.
	RPCAddr string
	// TTL is how long published entries outlive their owner: store
	// backends that can expire keys (etcd, Redis) keep them alive while
	// the owner runs (default DefaultTTL).
	TTL time.Duration
	// PollInterval is how often a watch polls where the store cannot
	// notify changes (default 1s).
	PollInterval time.Duration
	// Token, when set, authenticates P2P handshake requests (Client.Token).
	Token []byte
	// Logger: nil = slog.Default(), so the application's slog setup applies.
	Logger *slog.Logger
}

// DefaultTTL is the default lifetime of a published entry whose owner
// stopped refreshing it.
const DefaultTTL = 10 * time.Second

// Open returns the backend for a connection string. Only P2PHANDSHAKE is
// built in here; other schemes are added by the packages that implement
// them, through Register, when the program imports them. A string without
// "scheme://" (other than P2PHANDSHAKE) is an etcd endpoint list, as in
// the reference. A scheme nobody registered is a *SchemeError naming the
// package to import.
func Open(conn string, opts Options) (Backend, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = time.Second
	}
	if opts.ClusterID == "" {
		opts.ClusterID = os.Getenv(ClusterIDEnv)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if conn == "" || strings.EqualFold(conn, P2PHandshake) {
		return &p2p{opts: opts}, nil
	}
	scheme, _, hasScheme := strings.Cut(conn, "://")
	if !hasScheme {
		scheme = "etcd"
	}
	registry.RLock()
	open, ok := registry.open[scheme]
	registry.RUnlock()
	if !ok {
		return nil, &SchemeError{Scheme: scheme, Bare: !hasScheme, Import: backendPackages[scheme]}
	}
	return open(conn, opts)
}

// backendPackages names, per scheme, the Crescent package whose import
// registers it. engine/metadata/all imports them all.
var backendPackages = map[string]string{
	"etcd":   "github.com/crescent-kv/crescent/engine/metadata/etcdmeta",
	"redis":  "github.com/crescent-kv/crescent/engine/metadata/redismeta",
	"rediss": "github.com/crescent-kv/crescent/engine/metadata/redismeta",
	"http":   "github.com/crescent-kv/crescent/engine/metadata/httpmeta",
	"https":  "github.com/crescent-kv/crescent/engine/metadata/httpmeta",
}

// SchemeError is returned by Open for a connection string whose scheme no
// imported package registered. It matches ErrUnknownServer.
type SchemeError struct {
	Scheme string
	// Bare: the string had no "scheme://", so it was read as etcd.
	Bare bool
	// Import is the package that provides the scheme, "" if none is known.
	Import string
}

func (e *SchemeError) Error() string {
	what := fmt.Sprintf("metadata: scheme %q", e.Scheme)
	if e.Bare {
		what += " (a connection string without scheme:// is an etcd endpoint list)"
	}
	if e.Import != "" {
		return fmt.Sprintf("%s not registered: import _ %q", what, e.Import)
	}
	return fmt.Sprintf("%s not registered (registered: %s)", what, strings.Join(append([]string{P2PHandshake}, Schemes()...), ", "))
}

// Is makes a SchemeError match ErrUnknownServer.
func (e *SchemeError) Is(target error) bool { return target == ErrUnknownServer }

var registry struct {
	sync.RWMutex
	open map[string]func(conn string, opts Options) (Backend, error)
}

// Register adds a backend for connection strings "scheme://...", as
// database/sql drivers do: a backend package calls it from its init
// function, so importing the package (often as _) enables the scheme. A
// later Register of the same scheme replaces the earlier one. It panics
// on an empty scheme, one holding "://", or a nil open.
func Register(scheme string, open func(conn string, opts Options) (Backend, error)) {
	if scheme == "" || strings.Contains(scheme, "://") || open == nil {
		panic(fmt.Sprintf("metadata: Register(%q) with an invalid scheme or a nil open", scheme))
	}
	registry.Lock()
	defer registry.Unlock()
	if registry.open == nil {
		registry.open = map[string]func(conn string, opts Options) (Backend, error){}
	}
	registry.open[scheme] = open
}

// Schemes returns the registered schemes, sorted (P2PHANDSHAKE, built in,
// is not among them).
func Schemes() []string {
	registry.RLock()
	defer registry.RUnlock()
	return slices.Sorted(maps.Keys(registry.open))
}

type p2p struct{ opts Options }

func (p *p2p) Publish(context.Context, *SegmentDesc) error { return nil }
func (p *p2p) Remove(context.Context, string) error        { return nil }
func (p *p2p) Close() error                                { return nil }

func (p *p2p) RPCAddr(_ context.Context, name string) (string, error) {
	if _, _, err := net.SplitHostPort(name); err != nil {
		return "", fmt.Errorf("%w: P2P segment name %q is not host:port", ErrNotFound, name)
	}
	return name, nil
}

func (p *p2p) Get(ctx context.Context, name string) (*SegmentDesc, error) {
	addr, err := p.RPCAddr(ctx, name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	var self *SegmentDesc
	if p.opts.Self != nil {
		self = p.opts.Self()
	}
	return Client{Token: p.opts.Token}.FetchDesc(ctx, addr, self)
}

// Redact hides the password of a connection string (redis://user:pass@h)
// so it can go into errors and logs.
func Redact(conn string) string {
	u, err := url.Parse(conn)
	if err != nil || u.User == nil {
		return conn
	}
	return u.Redacted()
}
