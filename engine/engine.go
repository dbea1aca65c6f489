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
	"slices"
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
)

// P2PHandshake is the metadata connection string for descriptor exchange
// directly between peers (the default).
const P2PHandshake = metadata.P2PHandshake

// Config configures an Engine. The zero value works: P2P handshake, a
// port chosen in 15000–17000 on this host's address, shm then tcp.
type Config struct {
	// LocalServerName is "host", "host:port" or empty (this host's
	// address). Port 0 or no port picks a free port in PortRange. In P2P
	// mode the segment name is the resulting "host:port".
	LocalServerName string
	// MetadataServer is the metadata connection string
	// (default P2PHANDSHAKE).
	MetadataServer string
	// Protocols lists the transports to start, in order of preference
	// (default: shm, cxl, rdma, efa, tcp). Unknown names are an error; a transport
	// that fails to start is skipped with one log line.
	Protocols []string
	// PortRange bounds the handshake port chosen when none is given.
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
	// NotifyQueue bounds received notifications kept until drained
	// (default 65536; the oldest are dropped beyond it).
	NotifyQueue int
	// SegmentRefresh, when positive, fetches the descriptors of opened
	// segments again at this interval, so buffers a peer withdrew stop
	// being offered before a request hits them. Descriptors are always
	// fetched again when a request names a range the cached copy lacks.
	SegmentRefresh time.Duration

	// Handshake bounds the P2P handshake server: Timeout,
	// FirstByteTimeout, MaxConns, MaxConnsPerHost, MaxFrame (zero values
	// take metadata's defaults). Addr, Handlers and Logger are ignored.
	Handshake metadata.ServerConfig

	TCP tcp.Config
	Shm shm.Config
	CXL cxl.Config
	EFA efa.Config
	// RDMA configures the rdma transport; RDMA.Devices selects given
	// devices (such as the software device) instead of libibverbs'.
	RDMA rdma.Config

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
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

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

	reg        *transport.Registry
	transports []transport.Transport
	backend    metadata.Backend
	hs         *metadata.Server
	hostID     string

	segs    segTable
	batches handles[batch]

	descMu      sync.Mutex
	descVersion uint64
	desc        *metadata.SegmentDesc

	notifyMu      sync.Mutex
	notifies      []Notification
	notifyDropped uint64

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
		Notify: e.receiveNotify,
	}
	hs := cfg.Handshake
	hs.Handlers, hs.Logger = handlers, cfg.Logger
	e.hs, err = listenHandshake(host, port, cfg.PortRange, hs)
	if err != nil {
		return nil, err
	}
	e.name = e.hs.Addr()
	e.log = cfg.Logger.With("segment", e.name)

	e.backend, err = metadata.Open(cfg.MetadataServer, metadata.Options{
		Timeout: cfg.MetadataTimeout, Self: e.LocalDesc,
		ClusterID: cfg.MetadataClusterID, TTL: cfg.MetadataTTL,
		RPCAddr: e.name, Logger: e.log,
	})
	if err != nil {
		e.hs.Close()
		return nil, fmt.Errorf("%w: metadata server %q: %w", ErrInvalidConfig, cfg.MetadataServer, err)
	}

	env := transport.Env{LocalName: e.name, Host: host, HostID: e.hostID, Registry: e.reg, Logger: e.log, Handshake: handshake{e}}
	for _, p := range cfg.Protocols {
		t, err := newTransport(p, &cfg)
		if err != nil {
			e.closeStarted()
			return nil, err
		}
		if err := t.Start(env); err != nil {
			lvl := slog.LevelWarn
			if errors.Is(err, transport.ErrNotSupported) || errors.Is(err, cxl.ErrNoDevice) {
				lvl = slog.LevelInfo // not configured here: expected
			}
			e.log.Log(context.Background(), lvl, "transport not started; skipped", "protocol", p, "err", err)
			continue
		}
		e.transports = append(e.transports, t)
	}
	if len(e.transports) == 0 {
		e.closeStarted()
		return nil, fmt.Errorf("%w: no transport started of %v", ErrNoTransport, cfg.Protocols)
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
	for _, t := range e.transports {
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
	for _, t := range e.transports {
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
	for _, t := range e.transports {
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
	out := make([]string, len(e.transports))
	for i, t := range e.transports {
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
	r, err := e.reg.Add(mem, location, fd, off, size)
	if err != nil {
		if errors.Is(err, transport.ErrAlreadyExists) {
			return fmt.Errorf("%w: %w", ErrAlreadyRegistered, err)
		}
		return err
	}
	for _, t := range e.transports {
		if rt, ok := t.(transport.Registerer); ok {
			if err := rt.AfterRegister(r); err != nil {
				e.reg.Remove(context.Background(), r.Addr)
				e.dropDesc()
				return fmt.Errorf("engine: register with %s: %w", t.Name(), err)
			}
		}
	}
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

// UnregisterMemory withdraws mem (the slice given to RegisterMemory). New
// requests touching it are refused at once; it waits until ctx ends for
// transfers still touching it, and until same-host peers unmapped it.
func (e *Engine) UnregisterMemory(ctx context.Context, mem []byte) error {
	addr := transport.AddrOf(mem)
	if _, ok := e.reg.Find(addr, uint64(len(mem))); !ok {
		return fmt.Errorf("%w: [%#x,+%d)", ErrNotRegistered, addr, len(mem))
	}
	for _, t := range e.transports {
		if u, ok := t.(transport.Unregisterer); ok {
			if err := u.BeforeUnregister(ctx, addr, uint64(len(mem))); err != nil {
				e.log.Warn("peer did not confirm unmapping", "protocol", t.Name(), "err", err)
			}
		}
	}
	if _, err := e.reg.Remove(ctx, addr); err != nil {
		if errors.Is(err, transport.ErrNotRegistered) {
			return fmt.Errorf("%w: %w", ErrNotRegistered, err)
		}
		if errors.Is(err, transport.ErrBufferBusy) {
			return fmt.Errorf("%w: %w", ErrUnregisterBusy, err)
		}
		return err
	}
	return e.publish()
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
	for _, t := range e.transports {
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

func (e *Engine) receiveNotify(from, msg string) {
	e.notifyMu.Lock()
	defer e.notifyMu.Unlock()
	if len(e.notifies) >= e.cfg.NotifyQueue {
		e.notifies = slices.Delete(e.notifies, 0, 1)
		e.notifyDropped++
	}
	e.notifies = append(e.notifies, Notification{From: from, Msg: msg})
}

// Notifications drains the notifications received so far, oldest first.
func (e *Engine) Notifications() []Notification {
	e.notifyMu.Lock()
	defer e.notifyMu.Unlock()
	out := e.notifies
	e.notifies = nil
	return out
}

func (e *Engine) sendNotify(s *segment, msg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.MetadataTimeout)
	defer cancel()
	addr, err := e.backend.RPCAddr(ctx, s.name)
	if err != nil {
		return fmt.Errorf("engine: notify %s: %w", s.name, err)
	}
	return metadata.SendNotify(ctx, addr, e.name, msg)
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
	return metadata.Exchange(ctx, addr, metadata.Connection, req)
}

// Close stops the engine. Pending requests end FAILED with ErrClosed (via
// their transports); handles become invalid.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, t := range e.transports {
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
