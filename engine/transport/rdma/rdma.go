package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
	"github.com/crescent-kv/crescent/internal/verbs"
)

// Transport is the RDMA transport: one-sided READ/WRITE over RC queue
// pairs, on libibverbs devices or on the devices given in Config.
type Transport struct {
	cfg    Config
	cfgErr error
	env    transport.Env
	log    *slog.Logger

	lib     *verbs.Library // when devices were discovered
	owned   []rdmadev.Device
	nics    []*nic
	local   matrix
	localPM map[string][2][]string
	names   []string

	regs   regions
	health *health
	cache  *epCache

	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.RWMutex // Submit and handshakes hold it shared, Close exclusively
	started bool
	closed  bool

	peersMu sync.Mutex
	peers   map[string]*peerState

	bg transport.Goroutines // pollers, sweeps and handshakes Close waits for

	ctr atomic.Uint64 // spreads first attempts over NICs
	st  counters
}

var (
	_ transport.Transport    = (*Transport)(nil)
	_ transport.Registerer   = (*Transport)(nil)
	_ transport.Unregisterer = (*Transport)(nil)
)

// New returns an RDMA transport; Start opens its devices.
func New(cfg Config) *Transport {
	t := &Transport{cfg: cfg, peers: make(map[string]*peerState)}
	t.cfgErr = t.cfg.setDefaults()
	t.health = newHealth(&t.cfg)
	t.cache = newCache(t.cfg.MaxEndpoints)
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t
}

// Name implements transport.Transport.
func (t *Transport) Name() string { return protocolName }

// Start opens the NICs (the configured devices, or those libibverbs
// lists), a PD and a CQ on each, and installs the handshake handler. On
// a host without RDMA devices it fails with an error wrapping
// transport.ErrNotSupported.
func (t *Transport) Start(env transport.Env) error {
	if t.cfgErr != nil {
		return t.cfgErr
	}
	t.env, t.log = env, env.Logger
	if t.log == nil {
		t.log = slog.Default()
	}
	if env.Handshake == nil {
		return fmt.Errorf("%w: rdma needs the engine's handshake", transport.ErrNotSupported)
	}
	devs := t.cfg.Devices
	if len(devs) == 0 {
		lib, err := verbs.Load(t.cfg.Library)
		if err != nil {
			return notSupported(err)
		}
		devs, err = lib.Devices(verbs.Options{Names: t.cfg.DeviceNames, Port: t.cfg.Port, GIDIndex: t.cfg.GIDIndex})
		if err != nil {
			lib.Close()
			return notSupported(err)
		}
		t.lib, t.owned = lib, devs
	}
	if err := t.openNICs(devs); err != nil {
		t.release()
		return err
	}
	t.mu.Lock()
	t.started = true
	t.mu.Unlock()
	env.Handshake.Handle(protocolName, t.handleConnect)
	for _, n := range t.nics {
		t.bg.Go(n.poll)
	}
	t.bg.Go(t.sweepLoop)
	t.log.Debug("rdma transport started", "nics", t.names, "slice", t.cfg.SliceSize, "qps_per_endpoint", t.cfg.QPsPerEndpoint)
	return nil
}

func notSupported(err error) error {
	if errors.Is(err, rdmadev.ErrNotSupported) {
		return fmt.Errorf("%w: %w", transport.ErrNotSupported, err)
	}
	return err
}

func (t *Transport) openNICs(devs []rdmadev.Device) error {
	var skipped []string
	seen := make(map[string]bool)
	for _, d := range devs {
		info := d.Info()
		if seen[info.Name] {
			return fmt.Errorf("%w: two devices named %q", ErrConfig, info.Name)
		}
		seen[info.Name] = true
		port, ok := pickPort(info, t.cfg.Port)
		if !ok {
			skipped = append(skipped, info.Name)
			continue
		}
		n, err := newNIC(t, len(t.nics), d, info, port)
		if err != nil {
			return err
		}
		t.nics = append(t.nics, n)
		t.names = append(t.names, info.Name)
	}
	if len(t.nics) == 0 {
		return fmt.Errorf("%w (no active port on %v)", ErrNoDevices, skipped)
	}
	if len(skipped) > 0 {
		t.log.Info("rdma: devices without an active port skipped", "devices", skipped)
	}
	numa := make([]int, len(t.nics))
	for i, n := range t.nics {
		numa[i] = n.numa
	}
	t.localPM = t.cfg.PriorityMatrix
	if t.localPM == nil {
		t.localPM = numaMatrix(t.names, numa)
	}
	var err error
	t.local, err = resolveMatrix(t.names, t.localPM, true)
	return err
}

// pickPort returns the configured port, or the first ACTIVE one.
func pickPort(info rdmadev.DeviceInfo, want uint8) (rdmadev.PortInfo, bool) {
	for _, p := range info.Ports {
		if want != 0 && p.Num == want || want == 0 && p.State == rdmadev.PortActive {
			return p, p.GID != (rdmadev.GID{}) || p.LID != 0
		}
	}
	return rdmadev.PortInfo{}, false
}

func (t *Transport) stopping() bool { return t.ctx.Err() != nil }

func (t *Transport) isClosed() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.closed || !t.started
}

// Describe implements transport.Transport: the reference's rdma fields —
// the NICs appended to devices [{name, lid, gid}], their rkey and lkey
// appended to each buffer's (at the same indexes, padded with 0 where
// another transport has no key), the priority matrix — and the "rdma"
// extension locating the NICs.
func (t *Transport) Describe(d *metadata.SegmentDesc) {
	if !t.started {
		return
	}
	first := len(d.Devices)
	for _, n := range t.nics {
		d.Devices = append(d.Devices, metadata.Device{Name: n.name, LID: n.port.LID, GID: n.port.GID.String()})
	}
	for i := range d.Buffers {
		b := &d.Buffers[i]
		r := t.regs.find(b.Addr, b.Length)
		if r == nil || r.addr != b.Addr || r.end != b.Addr+b.Length {
			continue
		}
		r.mu.Lock()
		closing := r.closing
		r.mu.Unlock()
		if closing {
			continue
		}
		for len(b.RKey) < first {
			b.RKey = append(b.RKey, 0)
		}
		for len(b.LKey) < first {
			b.LKey = append(b.LKey, 0)
		}
		b.RKey, b.LKey = b.RKey[:first], b.LKey[:first]
		for k := range r.rkeys {
			b.RKey = append(b.RKey, uint64(r.rkeys[k]))
			b.LKey = append(b.LKey, uint64(r.lkeys[k]))
		}
	}
	d.PriorityMatrix = mergeMatrix(d.PriorityMatrix, t.localPM)
	if d.Crescent == nil {
		d.Crescent = &metadata.Extension{Version: 1}
	}
	d.Crescent.RDMA = &metadata.RDMAInfo{FirstDevice: first, Devices: len(t.nics)}
}

// mergeMatrix adds our NICs to a matrix another transport may have
// written (names never collide: each lists its own devices).
func mergeMatrix(dst, src map[string][2][]string) map[string][2][]string {
	if len(dst) == 0 {
		return src
	}
	out := make(map[string][2][]string, len(dst)+len(src))
	for k, v := range dst {
		out[k] = [2][]string{slices.Clone(v[0]), slices.Clone(v[1])}
	}
	for k, v := range src {
		o := out[k]
		out[k] = [2][]string{append(o[0], v[0]...), append(o[1], v[1]...)}
	}
	return out
}

// peer returns the parsed state of a peer's current descriptor.
func (t *Transport) peer(p transport.Peer) *peerState {
	d := p.Desc()
	name := p.Name()
	t.peersMu.Lock()
	defer t.peersMu.Unlock()
	if ps := t.peers[name]; ps != nil && ps.desc == d {
		return ps
	}
	ps := parsePeer(name, d)
	t.peers[name] = ps
	return ps
}

// Accepts implements transport.Transport: the peer advertises rdma
// devices, keys for the buffer holding the range, and some NIC pair to it
// is neither paused nor down.
func (t *Transport) Accepts(p transport.Peer, addr, length uint64) bool {
	if t.isClosed() {
		return false
	}
	ps := t.peer(p)
	return ps.err == nil && ps.find(addr, length) != nil && t.anyPath(ps)
}

// ClosePeer implements transport.Transport: the peer's state is dropped
// and our endpoints to it are drained.
func (t *Transport) ClosePeer(name string) {
	t.peersMu.Lock()
	if ps := t.peers[name]; ps != nil {
		ps.closed.Store(true)
		delete(t.peers, name)
	}
	t.peersMu.Unlock()
	live, _ := t.cache.snapshot()
	for _, ep := range live {
		if ep.peerSeg == name && !ep.key.passive {
			t.resend(ep.drain(), false, nil)
		}
	}
}

// sweepLoop checks deadlines, overdue flushes and down ports.
func (t *Transport) sweepLoop() {
	tick := time.NewTicker(t.cfg.SweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case now := <-tick.C:
			t.sweep(now)
		}
	}
}

func (t *Transport) sweep(now time.Time) {
	// Posted slices of expired jobs: the only way to get their buffers
	// back safely is to flush (or reset) their QPs.
	var expired []*endpoint
	for _, n := range t.nics {
		n.mu.Lock()
		for _, s := range n.slots {
			if s != nil && s.j.expired(now) && !containsEP(expired, s.ep) {
				expired = append(expired, s.ep)
			}
		}
		n.mu.Unlock()
	}
	for _, ep := range expired {
		t.resend(ep.fail(fmt.Errorf("%w: posted work past its deadline", transport.ErrTimeout)), false, nil)
	}
	live, limbo := t.cache.snapshot()
	for _, ep := range live {
		ep.dropExpired(now)
	}
	for _, ep := range limbo {
		ep.mu.Lock()
		// Draining endpoints are healthy: their work completes by itself
		// (and one past its deadline makes the endpoint fail first).
		overdue := ep.state == stFailing && ep.outstanding > 0 && now.After(ep.flushBy)
		ep.mu.Unlock()
		if overdue {
			t.resetEndpoint(ep)
		}
	}
	for _, n := range t.nics {
		if n.up.Load() || n.broken.Load() || now.UnixNano() < n.nextPortCheck.Load() {
			continue
		}
		n.nextPortCheck.Store(now.Add(t.cfg.PortCheckInterval).UnixNano())
		if pi, err := n.dev.QueryPort(n.port.Num); err == nil && pi.State == rdmadev.PortActive {
			n.up.Store(true)
			t.log.Info("rdma: port active again; NIC back in service", "nic", n.path)
		}
	}
}

// resetEndpoint resets the QPs of an endpoint whose flush did not come
// in time: after Reset the device no longer touches the slices' memory,
// so they can be completed (and their buffers released).
func (t *Transport) resetEndpoint(ep *endpoint) {
	ep.mu.Lock()
	qps := slices.Clone(ep.qps)
	ep.mu.Unlock()
	for _, q := range qps {
		if err := q.Reset(); err != nil {
			t.log.Warn("rdma: QP reset failed", "nic", ep.n.path, "err", err)
		}
	}
	t.st.resets.Add(uint64(len(qps)))
	t.log.Warn("rdma: QPs did not flush in time; reset", "local", ep.n.path, "peer", ep.peerPath, "qps", len(qps))
	n := ep.n
	var ss []*slice
	n.mu.Lock()
	for i, s := range n.slots {
		if s != nil && s.ep == ep {
			ss = append(ss, n.takeLocked(uint64(n.gens[i])<<32|uint64(i)))
		}
	}
	n.mu.Unlock()
	var redo, retry []*slice
	var lastErr error
	for _, s := range ss {
		t.complete(s, rdmadev.WCWRFlushErr, 0, &redo, &retry, &lastErr)
	}
	t.resend(redo, false, nil)
	t.resend(retry, true, lastErr)
}

// Close implements transport.Transport: pending tasks complete with
// transport.ErrClosed after their QPs are reset, then every QP, MR, CQ
// and PD is released (and devices the transport opened).
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	started := t.started
	t.mu.Unlock()
	if started {
		t.env.Handshake.Handle(protocolName, nil)
	}
	t.cancel()
	t.bg.Stop()
	// Nothing of ours runs now and no Submit is inside.
	live, limbo := t.cache.snapshot()
	eps := append(live, limbo...)
	for _, ep := range eps {
		for _, q := range ep.qps {
			q.Reset()
		}
	}
	for _, n := range t.nics {
		var ss []*slice
		n.mu.Lock()
		for i, s := range n.slots {
			if s != nil {
				ss = append(ss, n.takeLocked(uint64(n.gens[i])<<32|uint64(i)))
			}
		}
		n.mu.Unlock()
		for _, s := range ss {
			s.j.done(s, transport.ErrClosed)
		}
	}
	for _, ep := range eps {
		ep.mu.Lock()
		pend := ep.pending
		ep.pending = nil
		ep.outstanding = 0
		ep.mu.Unlock()
		for _, s := range pend {
			s.j.done(s, transport.ErrClosed)
		}
		ep.destroy()
	}
	return t.release()
}

// release frees regions, CQs, PDs and what the transport opened.
func (t *Transport) release() error {
	var errs []error
	for _, r := range t.regs.snapshot() {
		errs = append(errs, r.closeMRs()...)
	}
	t.regs.mu.Lock()
	t.regs.list = nil
	t.regs.mu.Unlock()
	for _, n := range t.nics {
		if err := n.cq.Close(); err != nil {
			errs = append(errs, fmt.Errorf("rdma: %s: close CQ: %w", n.name, err))
		}
		if err := n.pd.Close(); err != nil {
			errs = append(errs, fmt.Errorf("rdma: %s: close PD: %w", n.name, err))
		}
	}
	for _, d := range t.owned {
		if err := d.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	t.owned = nil
	if t.lib != nil {
		errs = append(errs, t.lib.Close())
		t.lib = nil
	}
	return errors.Join(errs...)
}

// NICs lists the NIC names in descriptor order.
func (t *Transport) NICs() []string { return slices.Clone(t.names) }
