package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/cxl"
	"github.com/crescent-kv/crescent/engine/transport/efa"
	"github.com/crescent-kv/crescent/engine/transport/rdma"
	"github.com/crescent-kv/crescent/engine/transport/shm"
	"github.com/crescent-kv/crescent/engine/transport/tcp"
	"github.com/crescent-kv/crescent/internal/auth"
)

// P2PHandshake is the metadata connection string for descriptor exchange
// directly between peers (the default).
const P2PHandshake = metadata.P2PHandshake

// Config configures an Engine. The zero value works: P2P handshake, a
// port chosen in 15000–17000 on this host's address, and the transports
// of Protocols' default (shm, cxl, rdma, efa, tcp) that can start here;
// on a host without CXL, RDMA or EFA devices that leaves shm then tcp.
// Zero fields below take the defaults their comments give.
type Config struct {
	// LocalServerName is "host", "host:port" or empty (this host's
	// address). Port 0 or no port picks a free port in PortRange. In P2P
	// mode the segment name is the resulting "host:port".
	LocalServerName string
	// MetadataServer is the metadata connection string (default
	// P2PHANDSHAKE). Other schemes need their backend package imported
	// (see "Metadata backends" in the package doc).
	MetadataServer string
	// Protocols lists the transports to start, in order of preference
	// (default: shm, cxl, rdma, efa, tcp). Unknown names are an error; a transport
	// that fails to start is skipped with one log line.
	Protocols []string
	// PortRange bounds the handshake port chosen when none is given
	// (default 15000–17000).
	PortRange [2]int
	// TransferTimeout bounds every request (default 60s): a request still
	// running then ends TIMEOUT.
	TransferTimeout time.Duration
	// MetadataTimeout bounds descriptor fetches and notifications
	// (default 5s).
	MetadataTimeout time.Duration
	// MetadataClusterID namespaces keys in etcd/Redis/HTTP stores
	// (default $MC_METADATA_CLUSTER_ID).
	MetadataClusterID string
	// MetadataTTL is how long the published descriptor outlives this
	// engine if it dies without Close (etcd lease / Redis expiry;
	// default metadata.DefaultTTL; not possible over HTTP).
	MetadataTTL time.Duration
	// Notifications is NotifyOn (the default, also "") to queue received
	// notifications for Notifications, or NotifyOff to refuse them: the
	// sender's notify fails and nothing is stored. Engines that never
	// drain Notifications (store clients) turn them off.
	Notifications NotifyMode
	// NotifyBudget bounds the bytes of queued notifications (sender name,
	// message and a fixed per-entry overhead; default 16 MiB). Beyond it
	// the oldest are dropped (Stats.NotificationsDropped).
	NotifyBudget int
	// NotifyMaxMessage bounds one notification (name + message; default
	// 64 KiB or NotifyBudget if smaller; more than NotifyBudget is an
	// error): bigger ones are dropped. The
	// handshake frame bound (metadata.DefaultMaxFrame, 1 MiB) is checked
	// before a frame is allocated.
	NotifyMaxMessage int
	// NotifyQueue bounds the number of queued notifications (default
	// 65536; the oldest are dropped beyond it).
	NotifyQueue int
	// SegmentRefresh, when positive, fetches the descriptors of opened
	// segments again at this interval, so buffers a peer withdrew stop
	// being offered before a request hits them. Descriptors are always
	// fetched again when a request names a range the cached copy lacks.
	SegmentRefresh time.Duration

	// Handshake bounds the P2P handshake server: Timeout,
	// FirstByteTimeout, MaxConns, MaxConnsPerHost, MaxFrame (zero values
	// take metadata's defaults). Addr, Handlers, Logger, Token and Allow
	// are ignored (Token and Allow come from Token, Insecure and
	// MooncakeCompat, as do TCP.Token, TCP.Allow and Shm.Token).
	Handshake metadata.ServerConfig

	// Token is the cluster credential (auth.LoadToken of --token_file).
	// With it every connection this engine serves or dials -- the P2P
	// handshake, each TCP data lane, the shm control socket -- passes
	// the auth challenge once before any frame moves, and the ports admit
	// any address. Without it the wire is the reference's and the TCP
	// ports admit loopback peers only, unless Insecure or MooncakeCompat.
	Token []byte
	// Insecure opens the TCP ports to any address without authentication
	// (--insecure). Refused together with Token.
	Insecure bool
	// MooncakeCompat serves Mooncake peers, which cannot authenticate:
	// the unauthenticated reference protocol, open to any address
	// (--mooncake_compat). It widens only this engine's ports, where
	// --insecure in a binary widens all of them. Refused together with
	// Token.
	MooncakeCompat bool

	TCP tcp.Config
	Shm shm.Config
	CXL cxl.Config
	EFA efa.Config
	// RDMA configures the rdma transport; RDMA.Devices selects given
	// devices (such as the software device) instead of libibverbs'.
	RDMA rdma.Config

	// Logger receives the engine's and its transports' lines (one line
	// at New naming the transports skipped and why); nil = slog.Default(),
	// so the application's slog setup applies.
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.MetadataServer == "" {
		c.MetadataServer = P2PHandshake
	}
	if len(c.Protocols) == 0 {
		c.Protocols = []string{"shm", "cxl", "rdma", "efa", "tcp"}
	}
	if c.PortRange == [2]int{} {
		c.PortRange = [2]int{15000, 17000}
	}
	if c.PortRange[0] <= 0 || c.PortRange[1] < c.PortRange[0] || c.PortRange[1] > 65535 {
		return fmt.Errorf("%w: port range %v", ErrInvalidConfig, c.PortRange)
	}
	if c.TransferTimeout <= 0 {
		c.TransferTimeout = 60 * time.Second
	}
	if c.MetadataTimeout <= 0 {
		c.MetadataTimeout = 5 * time.Second
	}
	if c.NotifyQueue <= 0 {
		c.NotifyQueue = 65536
	}
	switch c.Notifications {
	case "":
		c.Notifications = NotifyOn
	case NotifyOn, NotifyOff:
	default:
		return fmt.Errorf("%w: notifications %q (want %q or %q)", ErrInvalidConfig, c.Notifications, NotifyOn, NotifyOff)
	}
	if c.NotifyBudget <= 0 {
		c.NotifyBudget = 16 << 20
	}
	if c.NotifyMaxMessage <= 0 {
		c.NotifyMaxMessage = min(64<<10, c.NotifyBudget)
	}
	if c.NotifyMaxMessage > c.NotifyBudget {
		return fmt.Errorf("%w: notify max message %d > notify budget %d", ErrInvalidConfig, c.NotifyMaxMessage, c.NotifyBudget)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MooncakeCompat && c.Token != nil {
		return fmt.Errorf("%w: MooncakeCompat (--mooncake_compat) together with a Token (--token_file): Mooncake peers cannot authenticate; drop one", ErrInvalidConfig)
	}
	if _, err := c.authMode(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// authMode is the protected-default decision for this engine's ports.
func (c *Config) authMode() (auth.Mode, error) {
	if c.Token != nil && len(c.Token) < auth.MinTokenBytes {
		return 0, fmt.Errorf("token is %d bytes, want at least %d", len(c.Token), auth.MinTokenBytes)
	}
	return auth.Decide(c.Token != nil, c.Insecure || c.MooncakeCompat)
}

// AuthLogLine is the one line saying who this engine's ports admit.
func (c *Config) AuthLogLine() string {
	m, err := c.authMode()
	if err != nil {
		return err.Error()
	}
	if m == auth.Insecure && c.MooncakeCompat && !c.Insecure {
		return "--mooncake_compat: the engine serves any peer WITHOUT authentication (Mooncake peers cannot authenticate)"
	}
	return m.LogLine()
}

// NotifyMode says whether an engine accepts notifications.
type NotifyMode string

// Notification modes.
const (
	NotifyOn  NotifyMode = "on"
	NotifyOff NotifyMode = "off"
)

// Notification is a message another engine attached to a batch that wrote
// to or read from this one.
type Notification struct {
	From string // the sender's segment name
	Msg  string
}

// Engine moves bytes between registered local memory and peer segments.
// All methods are safe for concurrent use.
type Engine struct {
	cfg  Config
	name string
	log  *slog.Logger

	reg     *transport.Registry
	backend metadata.Backend
	env     transport.Env // what transports start with, also at InstallTransport
	hs      *metadata.Server
	hostID  string

	segs    segTable
	batches handles[batch]

	descMu      sync.Mutex
	descVersion uint64
	desc        *metadata.SegmentDesc

	notifyMu sync.Mutex
	notifies notifyRing

	// quarantine holds buffers a peer did not confirm it unmapped, by
	// address, until that peer's connection is gone.
	quarMu     sync.Mutex
	quarantine map[uint64]*QuarantineError

	// tlist is the running transports in order of preference, replaced
	// whole (copy on write) by Install/UninstallTransport so routing reads
	// it without a lock. trMu orders those against the per-transport steps
	// of (un)registration: a transport installed meanwhile must see every
	// buffer exactly once.
	trMu  sync.RWMutex
	tlist atomic.Pointer[[]transport.Transport]
	// uninstalled maps each transport UninstallTransport stopped to its
	// name, so requests it fails say why (one small entry per uninstall).
	uninstalled sync.Map
	removed     map[string]bool // names ever uninstalled; guarded by trMu

	stats  counters
	ready  atomic.Bool
	closed atomic.Bool

	// watchCtx ends at Close; segment watches derive from it.
	watchCtx  context.Context
	stopWatch context.CancelFunc

	bg          transport.Goroutines // background loops Close waits for
	stopRefresh chan struct{}
}

// refreshLoop fetches opened segments' descriptors every SegmentRefresh.
func (e *Engine) refreshLoop() {
	tick := time.NewTicker(e.cfg.SegmentRefresh)
	defer tick.Stop()
	for {
		select {
		case <-e.stopRefresh:
			return
		case <-tick.C:
		}
		e.segs.mu.RLock()
		segs := make([]*segment, 0, len(e.segs.byName))
		for _, s := range e.segs.byName {
			segs = append(segs, s)
		}
		e.segs.mu.RUnlock()
		for _, s := range segs {
			ctx, cancel := context.WithTimeout(context.Background(), e.cfg.MetadataTimeout)
			if _, err := s.Refresh(ctx); err != nil {
				e.log.Debug("segment refresh failed", "segment", s.name, "err", err)
			}
			cancel()
		}
	}
}

// New starts an engine: the handshake server, the metadata backend and
// the transports.
func New(cfg Config) (*Engine, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	host, port, err := splitServerName(cfg.LocalServerName)
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, log: cfg.Logger, reg: transport.NewRegistry(), hostID: hostID()}
	e.segs.byName = make(map[string]*segment)
	e.quarantine = make(map[uint64]*QuarantineError)
	e.watchCtx, e.stopWatch = context.WithCancel(context.Background())

	// The handshake server answers descriptor requests, notifications and
	// transport connection requests; its port names the segment.
	handlers := metadata.Handlers{
		Metadata: func() *metadata.SegmentDesc {
			if !e.ready.Load() {
				return nil // still starting: transports not described yet
			}
			return e.LocalDesc()
		},
	}
	if cfg.Notifications == NotifyOn {
		handlers.Notify = e.receiveNotify // off: the server refuses them
	}
	mode, _ := cfg.authMode() // checked by setDefaults
	cfg.Logger.Info("engine: "+cfg.AuthLogLine(), "mode", mode)
	hs := cfg.Handshake
	hs.Handlers, hs.Logger = handlers, cfg.Logger
	hs.Token, hs.Allow = cfg.Token, mode.AllowSameHost()
	cfg.TCP.Token, cfg.TCP.Allow = cfg.Token, mode.AllowSameHost()
	cfg.Shm.Token = cfg.Token
	e.cfg.TCP, e.cfg.Shm = cfg.TCP, cfg.Shm // InstallTransport starts them alike
	e.hs, err = listenHandshake(host, port, cfg.PortRange, hs)
	if err != nil {
		return nil, err
	}
	e.name = e.hs.Addr()
	e.log = cfg.Logger.With("segment", e.name)

	e.backend, err = metadata.Open(cfg.MetadataServer, metadata.Options{
		Timeout: cfg.MetadataTimeout, Self: e.LocalDesc,
		ClusterID: cfg.MetadataClusterID, TTL: cfg.MetadataTTL,
		RPCAddr: e.name, Logger: e.log, Token: cfg.Token,
	})
	if err != nil {
		e.hs.Close()
		return nil, fmt.Errorf("%w: metadata server %q: %w", ErrInvalidConfig, metadata.Redact(cfg.MetadataServer), err)
	}

	env := transport.Env{LocalName: e.name, Host: host, HostID: e.hostID, Registry: e.reg, Logger: e.log, Handshake: handshake{e}}
	e.env = env
	var started []transport.Transport
	var skipped []string // "protocol: why", logged in one line
	lvl := slog.LevelInfo
	for _, p := range cfg.Protocols {
		t, err := newTransport(p, &cfg)
		if err != nil {
			e.tlist.Store(&started)
			e.closeStarted()
			return nil, err
		}
		if wrapTransport != nil {
			t = wrapTransport(t)
		}
		if err := t.Start(env); err != nil {
			// Not configured here (no NIC, no provider, no device) is
			// expected; any other failure is worth a warning.
			if !errors.Is(err, transport.ErrNotSupported) && !errors.Is(err, cxl.ErrNoDevice) {
				lvl = slog.LevelWarn
			}
			skipped = append(skipped, p+": "+err.Error())
			continue
		}
		started = append(started, t)
	}
	e.tlist.Store(&started)
	if len(started) == 0 {
		e.closeStarted()
		return nil, fmt.Errorf("%w: no transport started of %v (%s)", ErrNoTransport, cfg.Protocols, strings.Join(skipped, "; "))
	}
	if len(skipped) > 0 {
		e.log.Log(context.Background(), lvl, "transports skipped", "started", e.Transports(), "skipped", strings.Join(skipped, "; "))
	}
	if err := e.publish(); err != nil {
		e.closeStarted()
		return nil, err
	}
	e.ready.Store(true)
	if cfg.SegmentRefresh > 0 {
		e.stopRefresh = make(chan struct{})
		e.bg.Go(e.refreshLoop)
	}
	return e, nil
}

// wrapTransport, set by tests only, wraps each transport New starts.
var wrapTransport func(transport.Transport) transport.Transport

func newTransport(name string, cfg *Config) (transport.Transport, error) {
	switch name {
	case "tcp":
		return tcp.New(cfg.TCP), nil
	case "cxl":
		return cxl.New(cfg.CXL), nil
	case "shm":
		return shm.New(cfg.Shm), nil
	case "efa":
		return efa.New(cfg.EFA), nil
	case "rdma":
		return rdma.New(cfg.RDMA), nil
	}
	return nil, fmt.Errorf("%w: unknown protocol %q", ErrInvalidConfig, name)
}

func (e *Engine) closeStarted() {
	e.stopWatch()
	for _, t := range e.transportsNow() {
		t.Close()
	}
	if e.backend != nil {
		e.backend.Close()
	}
	e.hs.Close()
}

// splitServerName parses "host", "host:port" or "" into a host and a port
// (0 = choose).
func splitServerName(s string) (string, int, error) {
	if s == "" {
		return defaultHost(), 0, nil
	}
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return strings.Trim(s, "[]"), 0, nil
		}
		return "", 0, fmt.Errorf("%w: local server name %q: %w", ErrInvalidConfig, s, err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%w: local server name %q: bad port", ErrInvalidConfig, s)
	}
	if host == "" {
		host = defaultHost()
	}
	return host, port, nil
}

// defaultHost is the first non-loopback IPv4 address, else 127.0.0.1.
func defaultHost() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if ip, ok := a.(*net.IPNet); ok && !ip.IP.IsLoopback() && ip.IP.To4() != nil {
				return ip.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// hostID identifies the running kernel: processes with equal IDs can
// share memory.
func hostID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		h, _ := os.Hostname()
		return "host:" + h
	}
	return strings.TrimSpace(string(b))
}

func listenHandshake(host string, port int, rng [2]int, cfg metadata.ServerConfig) (*metadata.Server, error) {
	if port != 0 {
		cfg.Addr = net.JoinHostPort(host, strconv.Itoa(port))
		return metadata.NewServer(cfg)
	}
	// Random probing spreads engines started together over the range.
	n := rng[1] - rng[0] + 1
	first := rand.IntN(n)
	var lastErr error
	for i := 0; i < n && i < 512; i++ {
		p := rng[0] + (first+i*7919)%n
		cfg.Addr = net.JoinHostPort(host, strconv.Itoa(p))
		s, err := metadata.NewServer(cfg)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("engine: no free handshake port in %d-%d: %w", rng[0], rng[1], lastErr)
}

// Name is the local segment name peers open.
func (e *Engine) Name() string { return e.name }

// CXLDevice returns the mapped CXL device when the cxl transport runs:
// register slices of its Bytes to make them reachable over CXL.
func (e *Engine) CXLDevice() (*cxl.Device, bool) {
	for _, t := range e.transportsNow() {
		if c, ok := t.(*cxl.Transport); ok {
			return c.Device(), true
		}
	}
	return nil, false
}

// WarmupSegment sets up, now, the connections transports would otherwise
// make on the segment's first request (the efa transport's handshake and
// address-vector insertion). Transports that need none are skipped.
func (e *Engine) WarmupSegment(ctx context.Context, id SegmentID) error {
	s, err := e.segment(id)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range e.transportsNow() {
		if w, ok := t.(interface {
			Warmup(context.Context, transport.Peer) error
		}); ok {
			if err := w.Warmup(ctx, s); err != nil && !errors.Is(err, transport.ErrUnreachable) {
				errs = append(errs, fmt.Errorf("engine: warm up %s over %s: %w", s.name, t.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// Transports lists the started transports in order of preference.
func (e *Engine) Transports() []string {
	ts := e.transportsNow()
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name()
	}
	return out
}

// RegisterMemory makes mem reachable by peers. mem must stay mapped until
// UnregisterMemory; memory from a mempool.Pool (or any memfd-backed
// mapping the pool registry knows) can also be shared with same-host
// peers. location names the memory's placement ("cpu:0"; "" or "*" means
// detect).
func (e *Engine) RegisterMemory(mem []byte, location string) error {
	if e.closed.Load() {
		return ErrClosed
	}
	if location == "" || location == "*" {
		location = detectLocation(mem)
	}
	fd, off, size := -1, int64(0), int64(0)
	if pfd, poff, p, ok := mempool.Lookup(mem); ok {
		fd, off, size = pfd, poff, p.Size()
	}
	e.trMu.RLock()
	r, err := e.reg.Add(mem, location, fd, off, size)
	if err != nil {
		e.trMu.RUnlock()
		if errors.Is(err, transport.ErrAlreadyExists) {
			return fmt.Errorf("%w: %w", ErrAlreadyRegistered, err)
		}
		return err
	}
	ts := e.transportsNow()
	for k, t := range ts {
		if rt, ok := t.(transport.Registerer); ok {
			if err := rt.AfterRegister(r); err != nil {
				e.undoRegister(r, ts[:k])
				e.trMu.RUnlock()
				return fmt.Errorf("engine: register with %s: %w", t.Name(), err)
			}
		}
	}
	e.trMu.RUnlock()
	// A peer may have fetched the descriptor between Add and the
	// transports' registration (without their keys): rebuild it.
	e.dropDesc()
	return e.publish()
}

// dropDesc forgets the cached local descriptor.
func (e *Engine) dropDesc() {
	e.descMu.Lock()
	e.desc = nil
	e.descMu.Unlock()
}

// undoRegister withdraws r from the transports that registered it (in
// reverse order) and from the registry, after a later transport failed.
func (e *Engine) undoRegister(r *transport.Region, done []transport.Transport) {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.MetadataTimeout)
	defer cancel()
	for i := len(done) - 1; i >= 0; i-- {
		if u, ok := done[i].(transport.Unregisterer); ok {
			if err := u.BeforeUnregister(ctx, r.Addr, r.Len()); err != nil {
				e.log.Warn("undo registration", "protocol", done[i].Name(), "err", err)
			}
		}
	}
	e.reg.Remove(ctx, r.Addr)
	e.dropDesc()
	if err := e.publish(); err != nil {
		e.log.Warn("publish after undoing a registration", "err", err)
	}
}

// UnregisterMemory withdraws mem (the slice given to RegisterMemory). New
// requests touching it are refused at once and the descriptor is
// published without it; it waits until ctx ends for transfers still
// touching it, and until same-host peers unmapped it.
//
// nil means the memory may be freed or reused. ErrUnregisterBusy means
// transfers still ran when ctx ended: call UnregisterMemory again (it
// waits again) before reusing the memory. A *QuarantineError
// (ErrQuarantined) means a peer did not confirm it stopped using the
// memory: it must not be freed or reused until the error's Released
// channel closes (the peer's connection is gone); a later
// UnregisterMemory then returns nil.
func (e *Engine) UnregisterMemory(ctx context.Context, mem []byte) error {
	addr := transport.AddrOf(mem)
	e.quarMu.Lock()
	if q := e.quarantine[addr]; q != nil {
		select {
		case <-q.Released:
			delete(e.quarantine, addr)
		default:
			e.quarMu.Unlock()
			return q
		}
	}
	e.quarMu.Unlock()
	r, draining := e.reg.Lookup(addr)
	if r == nil {
		return fmt.Errorf("%w: [%#x,+%d)", ErrNotRegistered, addr, len(mem))
	}
	// An InstallTransport meanwhile would register the buffer with a
	// transport this call does not withdraw it from.
	e.trMu.RLock()
	defer e.trMu.RUnlock()
	if !draining { // a retry skips what the first call did
		var unconfirmed []<-chan struct{}
		var causes []error
		for _, t := range e.transportsNow() {
			u, ok := t.(transport.Unregisterer)
			if !ok {
				continue
			}
			err := u.BeforeUnregister(ctx, addr, r.Len())
			var ue *transport.UnconfirmedError
			switch {
			case errors.As(err, &ue):
				unconfirmed = append(unconfirmed, ue.Released...)
				causes = append(causes, err)
			case err != nil:
				// The transport withdrew the memory anyway (rdma
				// deregisters its MRs): nothing can reach it through it.
				e.log.Warn("unregister", "protocol", t.Name(), "err", err)
			}
		}
		if len(unconfirmed) > 0 {
			return e.quarantineRegion(r, unconfirmed, errors.Join(causes...))
		}
	}
	_, err := e.reg.Remove(ctx, addr)
	// Busy or not, the buffer has left the table: peers must learn it.
	perr := e.publish()
	switch {
	case errors.Is(err, transport.ErrNotRegistered):
		return fmt.Errorf("%w: %w", ErrNotRegistered, err)
	case errors.Is(err, transport.ErrBufferBusy):
		return fmt.Errorf("%w: %w", ErrUnregisterBusy, err)
	case err != nil:
		return err
	}
	return perr
}

// quarantineRegion hides r from new requests and keeps it pinned until
// every unconfirmed peer can no longer reach it (or the engine closes).
func (e *Engine) quarantineRegion(r *transport.Region, released []<-chan struct{}, cause error) error {
	hold, herr := e.reg.Acquire(r.Addr, r.Len())
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	e.reg.Remove(ended, r.Addr) // busy while held: the region drains
	q := &QuarantineError{Addr: r.Addr, Len: r.Len(), Err: cause, Released: r.Idle()}
	e.quarMu.Lock()
	e.quarantine[r.Addr] = q
	e.quarMu.Unlock()
	e.log.Warn("buffer quarantined: a peer did not confirm unmapping it", "addr", r.Addr, "len", r.Len(), "err", cause)
	if herr == nil {
		unpin := func() {
			for _, ch := range released {
				select {
				case <-ch:
				case <-e.watchCtx.Done():
				}
			}
			hold.Release()
		}
		if !e.bg.Go(unpin) {
			hold.Release() // closing: the transports cut their peers off
		}
	}
	if err := e.publish(); err != nil {
		e.log.Warn("publish after quarantining a buffer", "err", err)
	}
	return q
}

// Quarantined returns the buffers UnregisterMemory left quarantined
// whose peers can still reach them.
func (e *Engine) Quarantined() []*QuarantineError {
	e.quarMu.Lock()
	defer e.quarMu.Unlock()
	var out []*QuarantineError
	for _, q := range e.quarantine {
		select {
		case <-q.Released:
		default:
			out = append(out, q)
		}
	}
	return out
}

// LocalDesc returns the descriptor peers see, rebuilt when registrations
// change.
func (e *Engine) LocalDesc() *metadata.SegmentDesc {
	e.descMu.Lock()
	defer e.descMu.Unlock()
	v := e.reg.Version()
	if e.desc != nil && e.descVersion == v {
		return e.desc
	}
	d := &metadata.SegmentDesc{
		Name:      e.name,
		Protocol:  "tcp",
		Timestamp: metadata.Timestamp(time.Now()),
		Crescent:  &metadata.Extension{Version: 1, HostID: e.hostID},
	}
	for _, r := range e.reg.Regions() {
		d.Buffers = append(d.Buffers, metadata.Buffer{Name: r.Location, Addr: r.Addr, Length: r.Len()})
	}
	for _, t := range e.transportsNow() {
		d.Crescent.Protocols = append(d.Crescent.Protocols, t.Name())
		t.Describe(d)
	}
	e.desc, e.descVersion = d, v
	return d
}

func (e *Engine) publish() error {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.MetadataTimeout)
	defer cancel()
	if err := e.backend.Publish(ctx, e.LocalDesc()); err != nil {
		return fmt.Errorf("engine: publish segment descriptor: %w", err)
	}
	return nil
}

// notifyOverhead is what one queued notification costs besides its
// strings (the entry and the two string headers, rounded up).
const notifyOverhead = 64

func (e *Engine) receiveNotify(from, msg string) {
	size := len(from) + len(msg) + notifyOverhead
	e.notifyMu.Lock()
	defer e.notifyMu.Unlock()
	if len(from)+len(msg) > e.cfg.NotifyMaxMessage || size > e.cfg.NotifyBudget {
		e.notifies.dropped++
		return
	}
	e.notifies.push(Notification{From: from, Msg: msg}, size, e.cfg.NotifyBudget, e.cfg.NotifyQueue)
}

// Notifications drains the notifications received so far, oldest first.
func (e *Engine) Notifications() []Notification {
	e.notifyMu.Lock()
	defer e.notifyMu.Unlock()
	return e.notifies.drain()
}

// notifyRing is a FIFO of notifications bounded in bytes and count: a
// push beyond either bound drops the oldest, in O(1) each.
type notifyRing struct {
	buf     []Notification
	head, n int
	bytes   int // accounted size of the queued entries
	dropped uint64
}

func entrySize(x *Notification) int { return len(x.From) + len(x.Msg) + notifyOverhead }

func (r *notifyRing) push(x Notification, size, maxBytes, maxCount int) {
	for r.n > 0 && (r.bytes+size > maxBytes || r.n >= maxCount) {
		old := &r.buf[r.head]
		r.bytes -= entrySize(old)
		*old = Notification{}
		r.head = (r.head + 1) % len(r.buf)
		r.n--
		r.dropped++
	}
	if r.n == len(r.buf) {
		grown := make([]Notification, min(max(16, 2*len(r.buf)), maxCount))
		for i := 0; i < r.n; i++ {
			grown[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = grown, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = x
	r.n++
	r.bytes += size
}

func (r *notifyRing) drain() []Notification {
	if r.n == 0 {
		return nil
	}
	out := make([]Notification, r.n)
	for i := range out {
		out[i] = r.buf[(r.head+i)%len(r.buf)]
	}
	r.buf, r.head, r.n, r.bytes = nil, 0, 0, 0
	return out
}

// Notify delivers msg to the opened segment target now, with no batch
// (the reference's genNotifyInEngine); it returns once the peer's engine
// queued it or refused it.
func (e *Engine) Notify(target SegmentID, msg string) error {
	if e.closed.Load() {
		return ErrClosed
	}
	s, err := e.segment(target)
	if err != nil {
		return err
	}
	return e.sendNotify(s, msg)
}

func (e *Engine) sendNotify(s *segment, msg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.MetadataTimeout)
	defer cancel()
	addr, err := e.backend.RPCAddr(ctx, s.name)
	if err != nil {
		return fmt.Errorf("engine: notify %s: %w", s.name, err)
	}
	return metadata.Client{Token: e.cfg.Token}.SendNotify(ctx, addr, e.name, msg)
}

// handshake gives transports the engine's handshake server and client.
type handshake struct{ e *Engine }

func (h handshake) Handle(protocol string, f func(json.RawMessage) (json.RawMessage, error)) {
	h.e.hs.HandleProtocol(protocol, f)
}

func (h handshake) Exchange(ctx context.Context, peer string, req []byte) ([]byte, error) {
	addr, err := h.e.backend.RPCAddr(ctx, peer)
	if err != nil {
		return nil, err
	}
	return metadata.Client{Token: h.e.cfg.Token}.Exchange(ctx, addr, metadata.Connection, req)
}

// Close stops the engine. Pending requests end FAILED with ErrClosed (via
// their transports); handles become invalid.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	// Not under trMu: an UnregisterMemory may hold it while its transfers
	// drain, and closing the transports is what ends them. An
	// InstallTransport racing this closes its own transport (see there).
	var errs []error
	for _, t := range e.transportsNow() {
		if err := t.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, b := range e.batches.all() {
		b.expire(time.Now(), true, Failed, ErrClosed)
	}
	if e.stopRefresh != nil {
		close(e.stopRefresh)
	}
	e.stopWatch()
	e.bg.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.MetadataTimeout)
	if err := e.backend.Remove(ctx, e.name); err != nil {
		errs = append(errs, err)
	}
	cancel()
	errs = append(errs, e.backend.Close(), e.hs.Close())
	e.reg.Close()
	for _, b := range e.batches.all() {
		b.mu.Lock()
		if b.timer != nil {
			b.timer.Stop()
		}
		b.mu.Unlock()
	}
	return errors.Join(errs...)
}
