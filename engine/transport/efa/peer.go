package efa

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/fabric"
)

// remoteIndex is what one peer descriptor offers this transport.
type remoteIndex struct {
	devices  []string // the peer's domains
	virtAddr bool
	bufs     []rbuf // sorted by address
}

// rbuf is a peer buffer with its keys, one per peer domain.
type rbuf struct {
	addr, end uint64
	keys      []uint64
}

// find returns the buffer holding [a, a+n).
func (ri *remoteIndex) find(a, n uint64) *rbuf {
	i := sort.Search(len(ri.bufs), func(i int) bool { return ri.bufs[i].end > a })
	if i < len(ri.bufs) && a >= ri.bufs[i].addr && n <= ri.bufs[i].end-a {
		return &ri.bufs[i]
	}
	return nil
}

// remote returns d's index, or nil when d offers no endpoint of this
// transport's provider. Indexes are cached per descriptor (descriptors
// are replaced, never changed, on refresh).
func (t *Transport) remote(d *metadata.SegmentDesc) *remoteIndex {
	if d == nil {
		return nil
	}
	t.idxMu.Lock()
	defer t.idxMu.Unlock()
	if ri, ok := t.index[d]; ok {
		return ri
	}
	ri := buildIndex(d, t.info.Provider)
	if len(t.index) >= 1024 {
		clear(t.index) // old descriptors: keep the cache small
	}
	t.index[d] = ri
	return ri
}

func buildIndex(d *metadata.SegmentDesc, provider string) *remoteIndex {
	var ext metadata.EFAInfo
	switch {
	case d.Crescent != nil && d.Crescent.EFA != nil:
		ext = *d.Crescent.EFA
	case d.Protocol == Protocol:
		// A reference EFA segment: the EFA provider, virtual addresses,
		// every device.
		ext = metadata.EFAInfo{Provider: "efa", VirtAddr: true, Devices: len(d.Devices)}
	default:
		return nil
	}
	// metadata.Validate refuses such ranges; this stays as a defence, in
	// a form that cannot overflow (FirstDevice+Devices can).
	if ext.Provider != provider || ext.Devices <= 0 || ext.FirstDevice < 0 || ext.FirstDevice > len(d.Devices)-ext.Devices {
		return nil
	}
	end := ext.FirstDevice + ext.Devices
	ri := &remoteIndex{virtAddr: ext.VirtAddr}
	for _, dev := range d.Devices[ext.FirstDevice:end] {
		ri.devices = append(ri.devices, dev.Name)
	}
	for _, b := range d.Buffers {
		if b.Length == 0 || b.Addr+b.Length < b.Addr || len(b.RKey) < end {
			continue
		}
		ri.bufs = append(ri.bufs, rbuf{addr: b.Addr, end: b.Addr + b.Length, keys: b.RKey[ext.FirstDevice:end]})
	}
	sort.Slice(ri.bufs, func(i, j int) bool { return ri.bufs[i].addr < ri.bufs[j].addr })
	return ri
}

// Peer states.
const (
	idle = iota
	connecting
	ready
)

// peer is one remote segment: its endpoints as inserted in each local
// domain's address vector.
type peer struct {
	t       *Transport
	name    string
	devices []string

	mu      sync.Mutex
	state   int
	attempt *attempt // the running handshake
	waiting []*transport.Task
	conns   []*conn // by local domain (worker index)
	closed  bool
}

type attempt struct {
	done chan struct{}
	err  error
}

// conn is one (local domain, peer domain) pair.
type conn struct {
	w        *worker
	pr       *peer
	addr     fabric.Addr
	dev      int          // the peer domain's index
	inflight atomic.Int64 // requests using addr
	closed   atomic.Bool  // the peer was closed: remove addr when idle
	dead     atomic.Bool  // the peer's endpoint refused us: connect anew
	rmOnce   sync.Once
	progress time.Time // last op posted or completed; owned by the worker
}

// done ends one request on c.
func (c *conn) done() {
	if c.inflight.Add(-1) == 0 && c.closed.Load() {
		c.remove()
	}
}

func (c *conn) remove() {
	c.rmOnce.Do(func() { c.w.ep.Remove(c.addr) })
}

// peer returns the state of p, replacing one whose peer restarted (other
// domains) or whose endpoints refused us.
func (t *Transport) peer(p transport.Peer, ri *remoteIndex) (*peer, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, transport.ErrClosed
	}
	pr := t.peers[p.Name()]
	var old *peer
	if pr != nil && (!slices.Equal(pr.devices, ri.devices) || pr.stale()) {
		old, pr = pr, nil
	}
	if pr == nil {
		pr = &peer{t: t, name: p.Name(), devices: ri.devices}
		t.peers[p.Name()] = pr
	}
	t.mu.Unlock()
	if old != nil {
		old.close(fmt.Errorf("efa: %w: %s changed its endpoints", transport.ErrPeerGone, old.name))
	}
	return pr, nil
}

// stale reports whether a connected peer's endpoint refused us.
func (pr *peer) stale() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.state != ready {
		return false
	}
	for _, c := range pr.conns {
		if c.dead.Load() {
			return true
		}
	}
	return false
}

func (pr *peer) submit(p transport.Peer, tasks []*transport.Task) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.closed {
		failAll(tasks, transport.ErrClosed)
		return
	}
	if pr.state == ready {
		pr.dispatch(p, tasks)
		return
	}
	pr.waiting = append(pr.waiting, tasks...)
	if pr.state == idle {
		pr.startConnect(p)
	}
}

// warmup connects now, or waits for the handshake in progress.
func (pr *peer) warmup(ctx context.Context, p transport.Peer) error {
	pr.mu.Lock()
	switch {
	case pr.closed:
		pr.mu.Unlock()
		return transport.ErrClosed
	case pr.state == ready:
		pr.mu.Unlock()
		return nil
	case pr.state == idle:
		pr.startConnect(p)
	}
	at := pr.attempt
	pr.mu.Unlock()
	if at == nil { // start refused: the transport is closing
		return transport.ErrClosed
	}
	select {
	case <-at.done:
		return at.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startConnect runs the handshake on its own goroutine; pr.mu is held.
func (pr *peer) startConnect(p transport.Peer) {
	at := &attempt{done: make(chan struct{})}
	if !pr.t.bg.Go(func() { pr.connect(p, at) }) {
		failAll(pr.waiting, transport.ErrClosed)
		pr.waiting = nil
		return
	}
	pr.state, pr.attempt = connecting, at
}

func (pr *peer) connect(p transport.Peer, at *attempt) {
	t := pr.t
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.HandshakeTimeout)
	ri := t.remote(p.Desc())
	var conns []*conn
	err := fmt.Errorf("efa: %w: %s publishes no %s endpoints", transport.ErrUnreachable, pr.name, t.info.Provider)
	if ri != nil {
		conns, err = pr.handshake(ctx, ri)
	}
	cancel()
	pr.mu.Lock()
	pr.attempt = nil
	if err == nil && pr.closed {
		for _, c := range conns {
			c.remove()
		}
		err = transport.ErrClosed
	}
	if err != nil {
		pr.state = idle
		waiting := pr.waiting
		pr.waiting = nil
		at.err = err
		close(at.done)
		pr.mu.Unlock()
		failAll(waiting, fmt.Errorf("efa: %w: %w", transport.ErrUnreachable, err))
		return
	}
	pr.conns, pr.state = conns, ready
	waiting := pr.waiting
	pr.waiting = nil
	pr.dispatch(p, waiting)
	close(at.done)
	pr.mu.Unlock()
}

// handshake exchanges endpoint addresses with the peer for every local
// domain (paired with peer domain i mod n) and inserts the peer's into
// the address vectors.
func (pr *peer) handshake(ctx context.Context, ri *remoteIndex) ([]*conn, error) {
	t := pr.t
	if t.env.Handshake == nil {
		return nil, fmt.Errorf("efa: %w: no handshake to reach %s", transport.ErrUnreachable, pr.name)
	}
	var conns []*conn
	fail := func(err error) ([]*conn, error) {
		for _, c := range conns {
			c.remove()
		}
		return nil, err
	}
	for i, w := range t.workers {
		j := i % len(ri.devices)
		req := handshakeMsg{
			Protocol:     Protocol,
			LocalNicPath: nicPath(t.env.LocalName, w.info.Domain),
			PeerNicPath:  nicPath(pr.name, ri.devices[j]),
			EFAAddr:      hex.EncodeToString(w.address()),
		}
		t.st.handshakes.Add(1)
		b, err := t.env.Handshake.Exchange(ctx, pr.name, req.encode())
		if err != nil {
			return fail(fmt.Errorf("efa: handshake %s -> %s: %w", req.LocalNicPath, req.PeerNicPath, err))
		}
		rep, err := decodeHandshake(b)
		if err != nil {
			return fail(err)
		}
		if rep.ReplyMsg != "" {
			return fail(fmt.Errorf("efa: handshake rejected by %s: %s", req.PeerNicPath, rep.ReplyMsg))
		}
		a, err := rep.addr()
		if err != nil {
			return fail(err)
		}
		fa, err := w.ep.Insert(a)
		if err != nil {
			return fail(fmt.Errorf("efa: %w", err))
		}
		conns = append(conns, &conn{w: w, pr: pr, addr: fa, dev: j, progress: time.Now()})
	}
	return conns, nil
}

// handleConnection answers a peer's handshake: its endpoint path names
// one of our domains, and the reply carries that domain's address. The
// peer's address is inserted only when this side sends requests to it
// (its own handshake).
func (t *Transport) handleConnection(body json.RawMessage) (json.RawMessage, error) {
	t.st.passive.Add(1)
	req, err := decodeHandshake(body)
	if err != nil {
		return nil, errors.New("Malformed transfer handshake")
	}
	server, nic, ok := splitNicPath(req.PeerNicPath)
	if !ok || server != t.env.LocalName {
		return nil, fmt.Errorf("EFA nic path inconsistency: %q is not on %s", req.PeerNicPath, t.env.LocalName)
	}
	if _, err := req.addr(); err != nil {
		return nil, errors.New("No EFA address provided")
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, errors.New("efa transport closed")
	}
	i := slices.IndexFunc(t.workers, func(w *worker) bool { return w.info.Domain == nic })
	if i < 0 {
		return nil, fmt.Errorf("unknown EFA device %q", nic)
	}
	w := t.workers[i]
	rep := handshakeMsg{
		Protocol:     Protocol,
		LocalNicPath: nicPath(t.env.LocalName, w.info.Domain),
		PeerNicPath:  req.LocalNicPath,
		EFAAddr:      hex.EncodeToString(w.address()),
	}
	return rep.encode(), nil
}

// dispatch turns tasks into operations on the peer's connections and
// hands them to the domains' workers; pr.mu is held and pr is ready.
func (pr *peer) dispatch(p transport.Peer, tasks []*transport.Task) {
	if len(tasks) == 0 {
		return
	}
	t := pr.t
	ri := t.remote(p.Desc())
	if ri == nil {
		failAll(tasks, fmt.Errorf("efa: %w: %s no longer publishes %s endpoints", transport.ErrUnreachable, pr.name, t.info.Provider))
		return
	}
	batches := make([][]*op, len(t.workers))
	if len(t.workers) == 1 {
		batches[0] = make([]*op, 0, len(tasks)) // the common case: one growth-free slice
	}
	start := t.rr.Add(uint64(len(tasks))) - uint64(len(tasks))
	slice := uint64(t.cfg.SliceSize)
	var hint *localReg
	for i, tk := range tasks {
		c := pr.conns[(start+uint64(i))%uint64(len(pr.conns))]
		n := uint64(len(tk.Local))
		l := t.local(transport.AddrOf(tk.Local), n, hint)
		if l == nil || !l.acquire() {
			tk.Complete(0, fmt.Errorf("efa: %w: local [%#x,+%d)", transport.ErrNotRegistered, transport.AddrOf(tk.Local), n))
			continue
		}
		hint = l
		rb := ri.find(tk.RemoteAddr, n)
		if rb == nil || c.dev >= len(rb.keys) {
			l.release()
			tk.Complete(0, fmt.Errorf("efa: %w: [%#x,+%d) of %s", transport.ErrOutOfBounds, tk.RemoteAddr, n, pr.name))
			continue
		}
		remote := tk.RemoteAddr
		if !ri.virtAddr {
			remote -= rb.addr
		}
		r := reqPool.Get().(*req)
		r.task, r.conn, r.lreg = tk, c, l
		c.inflight.Add(1)
		mr, key, write := l.mrs[c.w.idx], rb.keys[c.dev], tk.Op == transport.Write
		for off := uint64(0); off < n; off += slice {
			end := min(off+slice, n)
			o := r.newOp()
			o.write, o.local, o.mr, o.remote, o.key = write, tk.Local[off:end:end], mr, remote+off, key
			batches[c.w.idx] = append(batches[c.w.idx], o)
		}
	}
	for i, b := range batches {
		if len(b) > 0 {
			t.workers[i].enqueue(b)
		}
	}
}

// close ends the peer: waiting tasks fail with err; address-vector
// entries go once their requests ended.
func (pr *peer) close(err error) {
	pr.mu.Lock()
	if pr.closed {
		pr.mu.Unlock()
		return
	}
	pr.closed = true
	waiting, conns := pr.waiting, pr.conns
	pr.waiting = nil
	pr.mu.Unlock()
	failAll(waiting, err)
	for _, c := range conns {
		c.closed.Store(true)
		if c.inflight.Load() == 0 {
			c.remove()
		}
	}
}
