package efa

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/fabric"
)

// EnvProvider is libfabric's own provider filter, read when
// Config.Provider is empty.
const EnvProvider = "FI_PROVIDER"

// DefaultProvider is the provider used when neither Config.Provider nor
// FI_PROVIDER names one: the EFA NIC. Software providers ("tcp;ofi_rxm",
// "sockets", "shm") are used only when asked for.
const DefaultProvider = "efa"

// Wait modes.
const (
	WaitAuto = "auto" // the completion queue's wait fd through the Go netpoller, when the provider has one
	WaitPoll = "poll" // polling with backoff
)

// Config tunes the transport. Zero values take the defaults.
type Config struct {
	// Provider is the libfabric provider ("efa", "tcp;ofi_rxm",
	// "sockets", "shm"); default $FI_PROVIDER, else "efa".
	Provider string
	// Domains lists the domains (NICs) to open, one endpoint each; default
	// every domain of the provider, keeping loopback ones only when the
	// engine's host is a loopback address (and then only those).
	Domains []string
	// Library is libfabric's path; default $MC_LIBFABRIC_PATH, else
	// libfabric.so.1, else /opt/amazon/efa/lib/libfabric.so.1.
	Library string
	// TxSize is the transmit queue depth asked of the provider (0 = the
	// provider's default).
	TxSize int
	// MaxInflight bounds operations posted at once per domain (default:
	// the provider's transmit depth, at most 4096). More than the provider
	// takes is allowed: its EAGAIN is back-pressure, never a failure.
	MaxInflight int
	// SliceSize splits larger requests (default: 8 MiB, or the provider's
	// maximum message size if smaller).
	SliceSize int
	// Retries is how often an operation that failed because its
	// connection broke (ENOTCONN, ECONNRESET, ECONNABORTED, EPIPE) is
	// posted again before its deadline (default 2; negative = never).
	Retries int
	// StuckGrace is how long past its deadline (or abort) an operation
	// whose completion never comes stays posted. Then the endpoint is
	// closed (the provider lets go of the buffer), the operation ends, and
	// a new endpoint replaces it (default 10s).
	StuckGrace time.Duration
	// HandshakeTimeout bounds the endpoint handshake with a peer (default
	// 5s).
	HandshakeTimeout time.Duration
	// PeerTimeout fails the queued requests to a peer whose operations
	// the provider has refused (EAGAIN) for this long while none posted
	// or completed: a peer that went away (default 5s).
	PeerTimeout time.Duration
	// Wait is WaitAuto (default) or WaitPoll.
	Wait string
}

func (c *Config) setDefaults() {
	if c.Provider == "" {
		c.Provider = os.Getenv(EnvProvider)
	}
	if c.Provider == "" {
		c.Provider = DefaultProvider
	}
	if c.SliceSize <= 0 {
		c.SliceSize = 8 << 20
	}
	if c.Retries == 0 {
		c.Retries = 2
	} else if c.Retries < 0 {
		c.Retries = 0
	}
	if c.StuckGrace <= 0 {
		c.StuckGrace = 10 * time.Second
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 5 * time.Second
	}
	if c.PeerTimeout <= 0 {
		c.PeerTimeout = 5 * time.Second
	}
	if c.Wait == "" {
		c.Wait = WaitAuto
	}
}

// Transport moves bytes with libfabric RMA over RDM endpoints, one per
// domain (NIC).
type Transport struct {
	cfg     Config
	env     transport.Env
	log     *slog.Logger
	workers []*worker
	info    fabric.Info // of the first domain: provider and addressing

	ctx    context.Context // canceled by Close: ends handshakes
	cancel context.CancelFunc

	mu     sync.Mutex
	peers  map[string]*peer
	closed bool

	bg transport.Goroutines // handshakes and drains Close waits for

	regMu   sync.RWMutex
	regs    map[uint64]*localReg // by region address
	nextKey atomic.Uint64

	idxMu sync.Mutex
	index map[*metadata.SegmentDesc]*remoteIndex

	rr atomic.Uint64 // spreads requests over domains

	st counters
}

type counters struct {
	handshakes, passive, tasks, ops, completed, failed, retries, cancels, resets, eagain atomic.Uint64
}

var (
	_ transport.Transport    = (*Transport)(nil)
	_ transport.Registerer   = (*Transport)(nil)
	_ transport.Unregisterer = (*Transport)(nil)
)

// New returns an EFA transport; Start opens the endpoints.
func New(cfg Config) *Transport {
	cfg.setDefaults()
	return &Transport{cfg: cfg, peers: make(map[string]*peer), regs: make(map[uint64]*localReg), index: make(map[*metadata.SegmentDesc]*remoteIndex)}
}

// Name implements transport.Transport.
func (t *Transport) Name() string { return Protocol }

// Start loads libfabric, opens one endpoint per domain of the provider
// and installs the handshake handler. It fails with an error wrapping
// transport.ErrNotSupported when libfabric or the provider is missing.
func (t *Transport) Start(env transport.Env) error {
	t.env, t.log = env, env.Logger
	if t.log == nil {
		t.log = slog.Default()
	}
	if err := fabric.Load(t.cfg.Library); err != nil {
		return fmt.Errorf("efa: %w: %w", transport.ErrNotSupported, err)
	}
	infos, err := fabric.Discover(t.cfg.Provider, t.cfg.TxSize)
	if err != nil {
		if errors.Is(err, fabric.ErrNoProvider) || errors.Is(err, fabric.ErrNotSupported) {
			return fmt.Errorf("efa: %w: %w", transport.ErrNotSupported, err)
		}
		return fmt.Errorf("efa: %w", err)
	}
	picked, err := pickDomains(infos, t.cfg.Provider, t.cfg.Domains, env.Host)
	if err != nil {
		return err
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for i, in := range picked {
		ep, err := fabric.Open(in, fabric.Options{TxSize: t.cfg.TxSize, Slots: t.cfg.MaxInflight, WaitFD: t.cfg.Wait != WaitPoll})
		if err != nil {
			t.closeWorkers()
			t.cancel()
			return fmt.Errorf("efa: %w", err)
		}
		w, err := newWorker(t, i, ep)
		if err != nil {
			ep.Close()
			t.closeWorkers()
			t.cancel()
			return err
		}
		t.workers = append(t.workers, w)
	}
	t.info = picked[0]
	if s := uint64(t.cfg.SliceSize); t.info.MaxMsgSize > 0 && s > t.info.MaxMsgSize {
		t.cfg.SliceSize = int(t.info.MaxMsgSize)
	}
	for _, r := range env.Registry.Regions() {
		if err := t.AfterRegister(r); err != nil {
			t.closeWorkers()
			t.cancel()
			return err
		}
	}
	for _, w := range t.workers {
		w.started = true
		go w.run()
	}
	if env.Handshake != nil {
		env.Handshake.Handle(Protocol, t.handleConnection)
	}
	doms := make([]string, len(t.workers))
	for i, w := range t.workers {
		doms[i] = w.info.Domain
	}
	t.log.Info("efa transport started", "libfabric", fabric.Version(), "provider", t.info.Provider, "domains", doms,
		"mr_mode", t.info.MRMode.String(), "progress", int(t.info.Progress), "delivery_complete", t.info.DeliveryComplete, "wait_fd", t.workers[0].file != nil)
	return nil
}

// pickDomains chooses the domains to open (see Config.Domains).
func pickDomains(infos []fabric.Info, provider string, want []string, host string) ([]fabric.Info, error) {
	var same []fabric.Info
	for _, in := range infos {
		// A layered provider may be listed under another name when the
		// filter names only its core ("tcp" gives "tcp;ofi_rxm"): keep
		// the first provider listed.
		if in.Provider == infos[0].Provider {
			same = append(same, in)
		}
	}
	if len(want) > 0 {
		var out []fabric.Info
		for _, d := range want {
			i := slices.IndexFunc(same, func(in fabric.Info) bool { return in.Domain == d })
			if i < 0 {
				return nil, fmt.Errorf("efa: %w: provider %s has no domain %q", transport.ErrNotSupported, provider, d)
			}
			out = append(out, same[i])
		}
		return out, nil
	}
	loopHost := false
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() || host == "localhost" {
		loopHost = true
	}
	var loop, other []fabric.Info
	for _, in := range same {
		if in.Loopback {
			loop = append(loop, in)
		} else {
			other = append(other, in)
		}
	}
	switch {
	case loopHost && len(loop) > 0:
		return loop, nil
	case len(other) > 0:
		return other, nil
	case len(loop) > 0:
		return nil, fmt.Errorf("efa: %w: provider %s offers only loopback domains and this engine's host %s is not a loopback address", transport.ErrNotSupported, provider, host)
	}
	return nil, fmt.Errorf("efa: %w: provider %s offers no domain", transport.ErrNotSupported, provider)
}

// Provider is the libfabric provider in use ("" before Start).
func (t *Transport) Provider() string { return t.info.Provider }

// Domains lists the open domains in order (devices in the descriptor).
func (t *Transport) Domains() []string {
	out := make([]string, len(t.workers))
	for i, w := range t.workers {
		out[i] = w.info.Domain
	}
	return out
}

// Describe implements transport.Transport: the domains as devices
// (after any already listed), every registered buffer's keys, and the
// "efa" extension locating them.
func (t *Transport) Describe(d *metadata.SegmentDesc) {
	if len(t.workers) == 0 {
		return
	}
	first := len(d.Devices)
	for _, w := range t.workers {
		gid := hex.EncodeToString(w.info.SrcAddr)
		if gid == "" {
			gid = "0"
		}
		d.Devices = append(d.Devices, metadata.Device{Name: w.info.Domain, GID: gid})
	}
	n := len(t.workers)
	t.regMu.RLock()
	for i := range d.Buffers {
		b := &d.Buffers[i]
		reg := t.regs[b.Addr]
		if reg == nil || reg.n != b.Length || reg.closing.Load() {
			continue // not (or no longer) reachable over efa
		}
		for len(b.RKey) < first {
			b.RKey = append(b.RKey, 0)
		}
		for len(b.LKey) < first {
			b.LKey = append(b.LKey, 0)
		}
		b.RKey, b.LKey = b.RKey[:first], b.LKey[:first]
		for _, k := range reg.keys {
			b.RKey = append(b.RKey, k)
			b.LKey = append(b.LKey, k)
		}
	}
	t.regMu.RUnlock()
	if d.Crescent == nil {
		d.Crescent = &metadata.Extension{Version: 1}
	}
	d.Crescent.EFA = &metadata.EFAInfo{Provider: t.info.Provider, VirtAddr: t.info.MRMode&fabric.MRVirtAddr != 0, FirstDevice: first, Devices: n}
}

// Accepts implements transport.Transport: the peer publishes endpoints
// of the same provider and keys for a buffer holding the range.
func (t *Transport) Accepts(p transport.Peer, addr, length uint64) bool {
	if len(t.workers) == 0 {
		return false
	}
	ri := t.remote(p.Desc())
	return ri != nil && ri.find(addr, length) != nil
}

// Submit implements transport.Transport. It never waits for the network:
// a peer not yet connected gets its handshake on another goroutine and
// the tasks wait for it.
func (t *Transport) Submit(p transport.Peer, tasks []*transport.Task) {
	t.st.tasks.Add(uint64(len(tasks)))
	ri := t.remote(p.Desc())
	if ri == nil {
		failAll(tasks, fmt.Errorf("efa: %w: %s publishes no %s endpoints", transport.ErrUnreachable, p.Name(), t.info.Provider))
		return
	}
	pr, err := t.peer(p, ri)
	if err != nil {
		failAll(tasks, err)
		return
	}
	pr.submit(p, tasks)
}

func failAll(tasks []*transport.Task, err error) {
	for _, tk := range tasks {
		tk.Complete(0, err)
	}
}

// Warmup connects to the peer now (handshake with every domain and
// address-vector insertion) instead of on its first request. It is
// idempotent.
func (t *Transport) Warmup(ctx context.Context, p transport.Peer) error {
	ri := t.remote(p.Desc())
	if ri == nil {
		return fmt.Errorf("efa: %w: %s publishes no %s endpoints", transport.ErrUnreachable, p.Name(), t.info.Provider)
	}
	pr, err := t.peer(p, ri)
	if err != nil {
		return err
	}
	return pr.warmup(ctx, p)
}

// ClosePeer implements transport.Transport: the peer's address-vector
// entries are removed once no operation uses them.
func (t *Transport) ClosePeer(name string) {
	t.mu.Lock()
	pr := t.peers[name]
	delete(t.peers, name)
	t.mu.Unlock()
	if pr != nil {
		pr.close(transport.ErrClosed)
	}
}

// Close implements transport.Transport: handshakes stop, endpoints close
// (the provider lets go of every buffer), pending tasks end with
// transport.ErrClosed, and the registrations, completion queues, address
// vectors, domains and fabrics are closed.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	peers := t.peers
	t.peers = map[string]*peer{}
	t.mu.Unlock()
	if len(t.workers) == 0 {
		return nil
	}
	if t.env.Handshake != nil {
		t.env.Handshake.Handle(Protocol, nil)
	}
	t.cancel()
	for _, pr := range peers {
		pr.close(transport.ErrClosed)
	}
	// Endpoints first: every posted operation ends, which lets deferred
	// deregistrations finish; handshakes still running find them closed.
	err := t.closeWorkers()
	t.bg.Stop()
	return err
}

func (t *Transport) closeWorkers() error {
	var errs []error
	for _, w := range t.workers {
		errs = append(errs, w.shutdown())
	}
	return errors.Join(errs...)
}

// Stats are the transport's cumulative counters.
type Stats struct {
	Provider string
	Domains  []string
	// Handshakes this side started (per domain) and answered.
	Handshakes, PassiveHandshakes uint64
	// Tasks handed to Submit; Ops posted (slices and retries); tasks
	// Completed and Failed.
	Tasks, Ops, Completed, Failed uint64
	// Retries of operations whose connection broke; Cancels asked of the
	// provider; endpoint Resets after operations that never completed;
	// EAGAIN answers of the provider.
	Retries, Cancels, Resets, EAGAIN uint64
	// Loops counts the workers' polling rounds (a measure of idle cost).
	Loops uint64
}

// Stats returns the counters.
func (t *Transport) Stats() Stats {
	return Stats{
		Provider: t.info.Provider, Domains: t.Domains(),
		Handshakes: t.st.handshakes.Load(), PassiveHandshakes: t.st.passive.Load(),
		Tasks: t.st.tasks.Load(), Ops: t.st.ops.Load(), Completed: t.st.completed.Load(), Failed: t.st.failed.Load(),
		Retries: t.st.retries.Load(), Cancels: t.st.cancels.Load(), Resets: t.st.resets.Load(), EAGAIN: t.st.eagain.Load(),
		Loops: t.loops(),
	}
}

func (t *Transport) loops() uint64 {
	var n uint64
	for _, w := range t.workers {
		n += w.loops.Load()
	}
	return n
}

// localReg is a registered region's MRs, one per domain.
type localReg struct {
	addr, n  uint64
	mrs      []*fabric.MR // by worker index
	keys     []uint64
	inflight atomic.Int64 // requests using the MRs
	closing  atomic.Bool
	idleOnce sync.Once
	idle     chan struct{} // closed when closing and inflight reaches 0
}

func (l *localReg) contains(a, n uint64) bool {
	return a >= l.addr && n <= l.n && a-l.addr <= l.n-n
}

// acquire pins the MRs for one request; false once deregistration began.
func (l *localReg) acquire() bool {
	if l.closing.Load() {
		return false
	}
	l.inflight.Add(1)
	if l.closing.Load() {
		l.release()
		return false
	}
	return true
}

func (l *localReg) release() {
	if l.inflight.Add(-1) == 0 && l.closing.Load() {
		l.idleOnce.Do(func() { close(l.idle) })
	}
}

func (l *localReg) closeMRs() {
	for _, m := range l.mrs {
		m.Close()
	}
}

// AfterRegister implements transport.Registerer: the region is
// registered on every domain, under one key where the provider lets us
// choose it.
func (t *Transport) AfterRegister(r *transport.Region) error {
	if len(t.workers) == 0 {
		return nil
	}
	key := t.nextKey.Add(1)
	l := &localReg{addr: r.Addr, n: r.Len(), idle: make(chan struct{})}
	for _, w := range t.workers {
		m, err := w.ep.RegisterMR(r.Mem, key)
		if err != nil {
			l.closeMRs()
			return fmt.Errorf("efa: %w", err)
		}
		l.mrs = append(l.mrs, m)
		l.keys = append(l.keys, m.Key())
	}
	t.regMu.Lock()
	t.regs[r.Addr] = l
	t.regMu.Unlock()
	return nil
}

// BeforeUnregister implements transport.Unregisterer: new requests on the
// region are refused, and its registrations close once the requests
// using them ended (or, if ctx ends first, when they do). Peers'
// operations on it fail from then on.
func (t *Transport) BeforeUnregister(ctx context.Context, addr, length uint64) error {
	t.regMu.Lock()
	l := t.regs[addr]
	delete(t.regs, addr)
	t.regMu.Unlock()
	if l == nil {
		return nil
	}
	l.closing.Store(true)
	if l.inflight.Load() == 0 {
		l.idleOnce.Do(func() { close(l.idle) })
	}
	select {
	case <-l.idle:
		l.closeMRs()
		return nil
	case <-ctx.Done():
	}
	// Every request ends, at the latest when Close ends them (and closes
	// the MRs with the endpoints). Until the MRs close, peers can still
	// reach the memory: the caller learns when they no longer can.
	released := make(chan struct{})
	if !t.bg.Go(func() {
		<-l.idle
		l.closeMRs()
		close(released)
	}) {
		close(released) // closing: Close closes the MRs
	}
	return &transport.UnconfirmedError{
		Err:      fmt.Errorf("efa: %w: %d requests still use [%#x,+%d): %w", transport.ErrBufferBusy, l.inflight.Load(), addr, length, ctx.Err()),
		Released: []<-chan struct{}{released},
	}
}

// local returns the registration holding [a, a+n).
func (t *Transport) local(a, n uint64, hint *localReg) *localReg {
	if hint != nil && hint.contains(a, n) {
		return hint
	}
	r, ok := t.env.Registry.Find(a, n)
	if !ok {
		return nil
	}
	t.regMu.RLock()
	l := t.regs[r.Addr]
	t.regMu.RUnlock()
	if l == nil || !l.contains(a, n) {
		return nil
	}
	return l
}
