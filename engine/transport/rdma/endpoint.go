package rdma

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

type epState int

const (
	stConnecting epState = iota // handshake running; slices queue
	stConnected                 // posting
	stDraining                  // evicted: no new posts, destroyed once idle
	stFailing                   // QPs in ERR: waiting for flushes, then destroyed
	stClosed                    // QPs destroyed
)

// epKey names an endpoint: a local NIC and a peer NIC path. Passive
// endpoints (created by a peer's handshake) are kept apart from ours, so
// two peers connecting to each other at once never collide.
type epKey struct {
	nic     int
	peer    string
	passive bool
}

// endpoint is a set of RC QPs between a local NIC and a peer NIC.
type endpoint struct {
	t        *Transport
	n        *nic
	key      epKey
	peerSeg  string // segment name to send the handshake to
	peerPath string
	rlid     uint16      // from the peer's descriptor, for reference
	rgid     rdmadev.GID // peers whose handshake lacks local_gid

	mu          sync.Mutex
	state       epState
	qps         []rdmadev.QP
	depth       []int // outstanding WRs per QP
	outstanding int
	pending     []*slice
	nextQP      int
	wrs         []rdmadev.SendWR // scratch for PostSend
	flushBy     time.Time

	elem *list.Element // LRU position; guarded by the cache's mu
}

// enqueue adds slices to the endpoint's queue; false once it failed.
func (ep *endpoint) enqueue(ss []*slice) bool {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	switch ep.state {
	case stConnecting, stConnected:
		ep.pending = append(ep.pending, ss...)
		return true
	}
	return false
}

// kick posts queued slices, as many as the QPs and the NIC's completion
// budget allow, spread over the QPs: one PostSend per QP.
func (ep *endpoint) kick() {
	t, n := ep.t, ep.n
	var expired, redo []*slice
	var postErr error
	ep.mu.Lock()
	if ep.state != stConnected || len(ep.pending) == 0 {
		ep.mu.Unlock()
		return
	}
	expired = ep.takeExpiredLocked(time.Now())
	maxWR := t.cfg.MaxWR
	nq := len(ep.qps)
	for len(ep.pending) > 0 && postErr == nil {
		room := 0
		for _, d := range ep.depth {
			room += maxWR - d
		}
		// With more queued than fits, wait until a worthwhile batch fits
		// (completions of the full QPs or NIC kick us again) rather than
		// posting a few WRs per completion.
		postMin := min(len(ep.pending), max(1, maxWR/4))
		n.mu.Lock()
		free := len(n.free)
		k := min(len(ep.pending), room, free)
		if free < postMin {
			n.waiting[ep] = struct{}{}
		}
		n.mu.Unlock()
		if k < postMin {
			break
		}
		per := (k + nq - 1) / nq
		posted := 0
		for i := 0; i < nq && posted < k; i++ {
			qi := (ep.nextQP + i) % nq
			m := min(per, maxWR-ep.depth[qi], k-posted)
			if m <= 0 {
				continue
			}
			batch := ep.pending[posted : posted+m]
			wrs := ep.wrs[:0]
			n.mu.Lock()
			for _, s := range batch {
				s.ep, s.qp = ep, qi
				s.id = n.allocLocked(s)
				wrs = append(wrs, s.wr())
			}
			n.mu.Unlock()
			ep.wrs = wrs
			ep.depth[qi] += m
			ep.outstanding += m
			c, err := ep.qps[qi].PostSend(wrs)
			t.st.postCalls.Add(1)
			t.st.posted.Add(uint64(c))
			if err != nil {
				n.mu.Lock()
				for _, s := range batch[c:] {
					n.takeLocked(s.id)
				}
				n.mu.Unlock()
				ep.depth[qi] -= m - c
				ep.outstanding -= m - c
				redo = append(redo, batch[c:]...)
				posted += m
				postErr = fmt.Errorf("rdma: post on %s -> %s: %w", n.path, ep.peerPath, err)
				break
			}
			posted += m
		}
		rest := ep.pending[posted:]
		if postErr != nil {
			redo = append(redo, rest...)
			rest = nil
		}
		oldLen := len(ep.pending)
		ep.pending = append(ep.pending[:0], rest...)
		clear(ep.pending[len(ep.pending):oldLen])
		ep.nextQP = (ep.nextQP + 1) % nq
	}
	ep.mu.Unlock()
	for _, s := range expired {
		s.j.done(s, s.j.timeoutErr())
	}
	if postErr != nil {
		t.log.Warn("rdma: post failed; endpoint dropped", "err", postErr)
		redo = append(redo, ep.fail(postErr)...)
		t.resend(redo, false, postErr)
	}
}

// retire counts one completion; it reports whether the endpoint was
// already failing (its errors are consequences, not news) and whether it
// is now failing or draining with nothing outstanding, so it can be
// destroyed.
func (ep *endpoint) retire(qi int) (failing, drained bool) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if qi < len(ep.depth) {
		ep.depth[qi]--
	}
	ep.outstanding--
	failing = ep.state == stFailing || ep.state == stClosed
	return failing, (ep.state == stFailing || ep.state == stDraining) && ep.outstanding == 0
}

// fail takes the endpoint out of service: its QPs go to ERR (flushing
// what is posted), it leaves the cache, and the slices it had queued are
// returned for routing again. It is destroyed once its completions are
// in (or, past FlushTimeout, by a reset).
func (ep *endpoint) fail(cause error) []*slice {
	t := ep.t
	ep.mu.Lock()
	if ep.state == stFailing || ep.state == stClosed {
		ep.mu.Unlock()
		return nil
	}
	ep.state = stFailing
	ep.flushBy = time.Now().Add(t.cfg.FlushTimeout)
	pend := ep.pending
	ep.pending = nil
	out := ep.outstanding
	qps := ep.qps
	ep.mu.Unlock()
	t.st.failedEndpoints.Add(1)
	t.log.Debug("rdma: endpoint failed", "local", ep.n.path, "peer", ep.peerPath, "passive", ep.key.passive, "outstanding", out, "cause", cause)
	t.cache.retire(ep)
	for _, q := range qps {
		if err := q.SetError(); err != nil {
			t.log.Debug("rdma: QP to ERR", "err", err)
		}
	}
	if out == 0 {
		ep.destroy()
	}
	return pend
}

// drain stops new posts on an evicted endpoint; it is destroyed when its
// outstanding work completes. Its queued slices are returned.
func (ep *endpoint) drain() []*slice {
	ep.mu.Lock()
	if ep.state != stConnected && ep.state != stConnecting {
		ep.mu.Unlock()
		return nil
	}
	wasConnecting := ep.state == stConnecting
	ep.state = stDraining
	pend := ep.pending
	ep.pending = nil
	out := ep.outstanding
	ep.mu.Unlock()
	ep.t.cache.retire(ep)
	if out == 0 || wasConnecting {
		ep.destroy()
	}
	return pend
}

// destroy closes the QPs once nothing is outstanding (or after a reset).
func (ep *endpoint) destroy() {
	ep.mu.Lock()
	if ep.state == stClosed {
		ep.mu.Unlock()
		return
	}
	ep.state = stClosed
	qps := ep.qps
	ep.qps = nil
	ep.mu.Unlock()
	closeQPs(qps)
	ep.t.cache.forget(ep)
}

// dropExpired ends queued slices whose job expired (endpoints waiting
// for a handshake or for room).
func (ep *endpoint) dropExpired(now time.Time) {
	ep.mu.Lock()
	expired := ep.takeExpiredLocked(now)
	ep.mu.Unlock()
	for _, s := range expired {
		s.j.done(s, s.j.timeoutErr())
	}
}

// takeExpiredLocked removes and returns the queued slices whose job
// expired by now; ep.mu is held.
func (ep *endpoint) takeExpiredLocked(now time.Time) []*slice {
	var expired []*slice
	keep := ep.pending[:0]
	for _, s := range ep.pending {
		if s.j.expired(now) {
			expired = append(expired, s)
		} else {
			keep = append(keep, s)
		}
	}
	clear(ep.pending[len(keep):])
	ep.pending = keep
	return expired
}

func closeQPs(qps []rdmadev.QP) {
	for _, q := range qps {
		q.Close()
	}
}

// epCache holds the live endpoints, bounded with LRU eviction, plus the
// ones out of service still waiting for their completions (limbo).
type epCache struct {
	mu    sync.Mutex
	m     map[epKey]*endpoint
	lru   list.List // front = most recently used
	limbo map[*endpoint]struct{}
	max   int
}

func newCache(max int) *epCache {
	return &epCache{m: make(map[epKey]*endpoint), limbo: make(map[*endpoint]struct{}), max: max}
}

// retire moves ep from the cache to limbo.
func (c *epCache) retire(ep *endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m[ep.key] == ep {
		delete(c.m, ep.key)
		c.lru.Remove(ep.elem)
	}
	c.limbo[ep] = struct{}{}
}

// forget drops a destroyed endpoint.
func (c *epCache) forget(ep *endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m[ep.key] == ep {
		delete(c.m, ep.key)
		c.lru.Remove(ep.elem)
	}
	delete(c.limbo, ep)
}

// insertLocked adds ep (replacing what held its key) and returns the
// endpoints to evict: least recently used first, idle ones preferred,
// never ep itself nor one still connecting.
func (c *epCache) insertLocked(ep *endpoint) (replaced *endpoint, victims []*endpoint) {
	if old := c.m[ep.key]; old != nil {
		c.lru.Remove(old.elem)
		replaced = old
	}
	c.m[ep.key] = ep
	ep.elem = c.lru.PushFront(ep)
	return replaced, c.trimLocked(ep)
}

// trimLocked evicts endpoints beyond the bound, sparing keep.
func (c *epCache) trimLocked(keep *endpoint) (victims []*endpoint) {
	for len(c.m) > c.max {
		var victim, busy *endpoint
		for e := c.lru.Back(); e != nil; e = e.Prev() {
			x := e.Value.(*endpoint)
			if x == keep {
				continue
			}
			x.mu.Lock()
			idle := x.outstanding == 0 && len(x.pending) == 0 && x.state == stConnected
			connecting := x.state == stConnecting
			x.mu.Unlock()
			if idle {
				victim = x
				break
			}
			if busy == nil && !connecting {
				busy = x
			}
		}
		if victim == nil {
			victim = busy
		}
		if victim == nil {
			break // all others are connecting: over the bound until they finish
		}
		delete(c.m, victim.key)
		c.lru.Remove(victim.elem)
		victims = append(victims, victim)
	}
	return victims
}

func (c *epCache) snapshot() (live, limbo []*endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ep := range c.m {
		live = append(live, ep)
	}
	for ep := range c.limbo {
		limbo = append(limbo, ep)
	}
	return live, limbo
}

func (c *epCache) counts() (active, passive, limbo int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.m {
		if k.passive {
			passive++
		} else {
			active++
		}
	}
	return active, passive, len(c.limbo)
}

// endpointFor queues slices on the endpoint from local NIC l to peer NIC
// r: ours, else one the peer connected (the reference shares endpoints
// both ways), else a new one whose handshake starts now, with the slices
// already queued. It returns nil once the transport is closing.
func (t *Transport) endpointFor(ps *peerState, l, r int, ss []*slice) *endpoint {
	pn := ps.nics[r]
	key := epKey{nic: l, peer: pn.path}
	c := t.cache
	c.mu.Lock()
	if ep := c.m[key]; ep != nil && ep.enqueue(ss) {
		c.lru.MoveToFront(ep.elem)
		c.mu.Unlock()
		return ep
	}
	if ep := c.m[epKey{nic: l, peer: pn.path, passive: true}]; ep != nil {
		ep.mu.Lock()
		ok := ep.state == stConnected
		if ok {
			ep.pending = append(ep.pending, ss...)
		}
		ep.mu.Unlock()
		if ok {
			c.lru.MoveToFront(ep.elem)
			c.mu.Unlock()
			return ep
		}
	}
	// None, or ours is failing (it leaves the cache by itself).
	ep := &endpoint{t: t, n: t.nics[l], key: key, peerSeg: ps.name, peerPath: pn.path, rlid: pn.lid, rgid: pn.gid,
		state: stConnecting, pending: append([]*slice(nil), ss...)}
	_, victims := c.insertLocked(ep)
	c.mu.Unlock()
	t.evict(victims)
	if !t.bg.Go(func() { t.connect(ep) }) {
		// Closing: Close completes what ep holds.
		return ep
	}
	return ep
}

func (t *Transport) evict(victims []*endpoint) {
	for _, v := range victims {
		t.st.evictions.Add(1)
		t.log.Debug("rdma: endpoint evicted", "local", v.n.path, "peer", v.peerPath, "passive", v.key.passive)
		t.resend(v.drain(), false, nil)
	}
}

// connect runs an endpoint's handshake (on its own goroutine).
func (t *Transport) connect(ep *endpoint) {
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	qps, err := t.dial(ctx, ep)
	t.st.handshakes.Add(1)
	ep.mu.Lock()
	if err == nil && ep.state == stConnecting {
		ep.qps, ep.depth = qps, make([]int, len(qps))
		ep.state = stConnected
		ep.mu.Unlock()
		ep.kick()
		// Endpoints connecting together may have passed the bound.
		t.cache.mu.Lock()
		victims := t.cache.trimLocked(ep)
		t.cache.mu.Unlock()
		t.evict(victims)
		return
	}
	ep.mu.Unlock()
	closeQPs(qps)
	if err == nil {
		return // taken out of service meanwhile; its slices were rerouted
	}
	t.st.handshakeErrors.Add(1)
	if t.ctx.Err() != nil {
		err = fmt.Errorf("%w: %w", transport.ErrClosed, err)
	} else {
		t.log.Warn("rdma: endpoint handshake failed", "local", ep.n.path, "peer", ep.peerPath, "err", err)
		t.pairError(ep.n, ep.peerPath)
	}
	t.resend(ep.fail(err), true, err)
}

// qpAccess is what a QP allows its peer: the reference's flags.
const qpAccess = rdmadev.AccessLocalWrite | rdmadev.AccessRemoteRead | rdmadev.AccessRemoteWrite | rdmadev.AccessRemoteAtomic

func (t *Transport) createQPs(n *nic, count int) ([]rdmadev.QP, error) {
	caps := rdmadev.QPCaps{MaxSendWR: t.cfg.MaxWR, MaxRecvWR: t.cfg.MaxWR, MaxSendSGE: t.cfg.MaxSGE, MaxRecvSGE: t.cfg.MaxSGE, MaxInline: t.cfg.MaxInline}
	qps := make([]rdmadev.QP, 0, count)
	for range count {
		q, err := n.pd.CreateQP(n.cq, caps)
		if err != nil {
			closeQPs(qps)
			return nil, fmt.Errorf("rdma: create QP on %s: %w", n.name, err)
		}
		qps = append(qps, q)
	}
	return qps, nil
}

// connectQP moves a QP RESET→INIT→RTR→RTS towards a peer QP, with the
// reference's attributes.
func (t *Transport) connectQP(n *nic, q rdmadev.QP, qpn uint32, lid uint16, gid rdmadev.GID, mtu rdmadev.MTU) error {
	if err := q.ToInit(n.port.Num, qpAccess); err != nil {
		return fmt.Errorf("rdma: QP %#x to INIT: %w", q.Num(), err)
	}
	err := q.ToRTR(rdmadev.RTRAttr{Port: n.port.Num, PathMTU: mtu, DestQPN: qpn, DestLID: lid, DestGID: gid,
		SGIDIndex: n.port.GIDIndex, Global: true, HopLimit: 16, MaxDestRdAtomic: 16, MinRNRTimer: 12})
	if err != nil {
		return fmt.Errorf("rdma: QP %#x to RTR (peer QP %#x, MTU %d): %w", q.Num(), qpn, mtu, err)
	}
	err = q.ToRTS(rdmadev.RTSAttr{Timeout: t.cfg.Timeout, RetryCount: t.cfg.RetryCount, RNRRetry: t.cfg.RNRRetry, MaxRdAtomic: 16})
	if err != nil {
		return fmt.Errorf("rdma: QP %#x to RTS: %w", q.Num(), err)
	}
	return nil
}

// dial creates the endpoint's QPs, exchanges the handshake and connects
// them.
func (t *Transport) dial(ctx context.Context, ep *endpoint) ([]rdmadev.QP, error) {
	n := ep.n
	qps, err := t.createQPs(n, t.cfg.QPsPerEndpoint)
	if err != nil {
		return nil, err
	}
	req := hsMsg{Protocol: protocolName, LocalNICPath: n.path, PeerNICPath: ep.peerPath, LocalLID: n.port.LID,
		LocalGID: n.port.GID.String(), MTU: int(n.port.ActiveMTU)}
	for _, q := range qps {
		req.QPNum = append(req.QPNum, q.Num())
	}
	body, err := t.env.Handshake.Exchange(ctx, ep.peerSeg, req.encode())
	if err != nil {
		closeQPs(qps)
		return nil, fmt.Errorf("%w: %s: %w", ErrHandshake, ep.peerPath, err)
	}
	rep, err := decodeHandshake(body)
	switch {
	case err != nil:
	case rep.ReplyMsg != "":
		err = fmt.Errorf("%w: %s replied: %s", ErrHandshake, ep.peerPath, rep.ReplyMsg)
	case rep.LocalNICPath != ep.peerPath || rep.PeerNICPath != n.path:
		err = fmt.Errorf("%w: reply for %s -> %s, expected %s -> %s", ErrHandshake, rep.LocalNICPath, rep.PeerNICPath, ep.peerPath, n.path)
	case len(rep.QPNum) != len(qps):
		err = fmt.Errorf("%w: %s answered %d QPs for %d", ErrHandshake, ep.peerPath, len(rep.QPNum), len(qps))
	}
	if err != nil {
		closeQPs(qps)
		return nil, err
	}
	gid, lid := ep.rgid, ep.rlid
	if rep.LocalGID != "" {
		if gid, err = rdmadev.ParseGID(rep.LocalGID); err != nil {
			closeQPs(qps)
			return nil, fmt.Errorf("%w: %s: %w", ErrHandshake, ep.peerPath, err)
		}
		lid = rep.LocalLID
	}
	mtu := rdmadev.NegotiateMTU(n.port.ActiveMTU, rdmadev.MTU(rep.MTU), t.cfg.MaxMTU)
	for i, q := range qps {
		if err := t.connectQP(n, q, rep.QPNum[i], lid, gid, mtu); err != nil {
			closeQPs(qps)
			return nil, err
		}
	}
	return qps, nil
}

// handleConnect answers a peer's handshake (the passive side): it
// creates as many QPs as the peer sent, connects them to the peer's, and
// keeps them as the passive endpoint for that peer NIC, replacing an
// older one (the peer re-established the connection).
func (t *Transport) handleConnect(body json.RawMessage) (json.RawMessage, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return nil, transport.ErrClosed
	}
	req, err := decodeHandshake(body)
	if err != nil {
		return nil, err
	}
	n, err := t.checkRequest(req)
	if err != nil {
		t.st.handshakeErrors.Add(1)
		t.log.Warn("rdma: handshake refused", "from", req.LocalNICPath, "err", err)
		return nil, err
	}
	gid, _ := rdmadev.ParseGID(req.LocalGID)
	peerSeg, _, _ := splitNICPath(req.LocalNICPath)
	qps, err := t.createQPs(n, len(req.QPNum))
	if err != nil {
		return nil, err
	}
	mtu := rdmadev.NegotiateMTU(n.port.ActiveMTU, rdmadev.MTU(req.MTU), t.cfg.MaxMTU)
	for i, q := range qps {
		if err := t.connectQP(n, q, req.QPNum[i], req.LocalLID, gid, mtu); err != nil {
			closeQPs(qps)
			return nil, err
		}
	}
	ep := &endpoint{t: t, n: n, key: epKey{nic: n.idx, peer: req.LocalNICPath, passive: true}, peerSeg: peerSeg,
		peerPath: req.LocalNICPath, rlid: req.LocalLID, rgid: gid, state: stConnected, qps: qps, depth: make([]int, len(qps))}
	t.cache.mu.Lock()
	replaced, victims := t.cache.insertLocked(ep)
	t.cache.mu.Unlock()
	if replaced != nil {
		t.resend(replaced.fail(errors.New("rdma: peer re-established the connection")), false, nil)
	}
	t.evict(victims)
	t.st.passive.Add(1)
	rep := hsMsg{Protocol: protocolName, LocalNICPath: n.path, PeerNICPath: req.LocalNICPath, LocalLID: n.port.LID,
		LocalGID: n.port.GID.String(), MTU: int(n.port.ActiveMTU)}
	for _, q := range qps {
		rep.QPNum = append(rep.QPNum, q.Num())
	}
	return rep.encode(), nil
}

// checkRequest validates a peer's handshake and returns the local NIC it
// names.
func (t *Transport) checkRequest(req *hsMsg) (*nic, error) {
	if req.Protocol != "" && req.Protocol != protocolName {
		return nil, fmt.Errorf("%w: protocol %q", ErrHandshake, req.Protocol)
	}
	server, dev, ok := splitNICPath(req.PeerNICPath)
	if !ok || server != t.env.LocalName {
		return nil, fmt.Errorf("%w: peer nic path inconsistency: expected %s@<device>, got %q", ErrHandshake, t.env.LocalName, req.PeerNICPath)
	}
	if _, _, ok := splitNICPath(req.LocalNICPath); !ok {
		return nil, fmt.Errorf("%w: parse peer nic path failed: %q", ErrHandshake, req.LocalNICPath)
	}
	var n *nic
	for _, x := range t.nics {
		if x.name == dev {
			n = x
		}
	}
	if n == nil {
		return nil, fmt.Errorf("%w: device %q not found on %s", ErrHandshake, dev, t.env.LocalName)
	}
	if !n.up.Load() {
		return nil, fmt.Errorf("%w: port of %s is down", ErrHandshake, n.path)
	}
	if len(req.QPNum) == 0 || len(req.QPNum) > maxQPsPerEndpoint {
		return nil, fmt.Errorf("%w: %d QP numbers (1..%d)", ErrHandshake, len(req.QPNum), maxQPsPerEndpoint)
	}
	for _, q := range req.QPNum {
		if q == 0 || q > 0xffffff {
			return nil, fmt.Errorf("%w: QP number %#x", ErrHandshake, q)
		}
	}
	if req.LocalGID == "" {
		return nil, fmt.Errorf("%w: handshake without local_gid", ErrHandshake)
	}
	if _, err := rdmadev.ParseGID(req.LocalGID); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	return n, nil
}
