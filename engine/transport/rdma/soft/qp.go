package soft

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

type pendingWR struct {
	wr  rdmadev.SendWR
	due time.Time
}

type dest struct {
	gid    rdmadev.GID
	lid    uint16
	global bool
	qpn    uint32
	mtu    rdmadev.MTU
}

// qp is an RC queue pair. Its state and send queue are guarded by d.mu;
// dma is held while the worker executes its work requests, so Reset and
// Close return only once the device stopped touching their memory.
type qp struct {
	d    *Device
	pd   *pd
	cq   *cq
	num  uint32
	caps rdmadev.QPCaps

	state     rdmadev.QPState
	access    rdmadev.Access
	dest      dest
	sq        []pendingWR
	posted    uint64
	gen       uint64 // bumped by Reset: completions of older work are dropped
	queued    bool
	destroyed bool

	dma sync.Mutex
	tmr *time.Timer // pending wake-up for delayed work; guarded by d.mu
}

func (q *qp) Num() uint32 { return q.num }

func (q *qp) ToInit(port uint8, access rdmadev.Access) error {
	d := q.d
	d.st.control.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.destroyed {
		return rdmadev.ErrClosed
	}
	if q.state != rdmadev.QPReset {
		return fmt.Errorf("%w: INIT from %v", rdmadev.ErrBadState, q.state)
	}
	if port != 1 {
		return fmt.Errorf("%w: port %d", rdmadev.ErrInvalid, port)
	}
	q.access = access
	q.state = rdmadev.QPInit
	return nil
}

func (q *qp) ToRTR(a rdmadev.RTRAttr) error {
	d := q.d
	d.st.control.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.destroyed {
		return rdmadev.ErrClosed
	}
	if q.state != rdmadev.QPInit {
		return fmt.Errorf("%w: RTR from %v", rdmadev.ErrBadState, q.state)
	}
	if !a.PathMTU.Valid() || a.PathMTU > d.mtu {
		return fmt.Errorf("%w: path MTU %d (port active MTU %d)", rdmadev.ErrInvalid, a.PathMTU, d.mtu)
	}
	if a.Global && a.DestGID.IsZero() || !a.Global && a.DestLID == 0 || a.DestQPN == 0 || a.DestQPN > 0xffffff {
		return fmt.Errorf("%w: RTR address %+v", rdmadev.ErrInvalid, a)
	}
	if d.ll == rdmadev.LinkEthernet && !a.Global {
		return fmt.Errorf("%w: RoCE needs a GRH", rdmadev.ErrInvalid)
	}
	q.dest = dest{gid: a.DestGID, lid: a.DestLID, global: a.Global, qpn: a.DestQPN, mtu: a.PathMTU}
	q.state = rdmadev.QPRTR
	return nil
}

func (q *qp) ToRTS(a rdmadev.RTSAttr) error {
	d := q.d
	d.st.control.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.destroyed {
		return rdmadev.ErrClosed
	}
	if q.state != rdmadev.QPRTR {
		return fmt.Errorf("%w: RTS from %v", rdmadev.ErrBadState, q.state)
	}
	q.state = rdmadev.QPRTS
	return nil
}

func (q *qp) SetError() error {
	d := q.d
	d.st.control.Add(1)
	d.mu.Lock()
	if q.destroyed {
		d.mu.Unlock()
		return rdmadev.ErrClosed
	}
	q.state = rdmadev.QPError
	d.mu.Unlock()
	d.enqueue(q)
	return nil
}

func (q *qp) Reset() error {
	q.d.st.control.Add(1)
	return q.reset(false)
}

// reset drops queued work and waits until the worker no longer executes
// any of it.
func (q *qp) reset(destroy bool) error {
	d := q.d
	d.mu.Lock()
	if q.destroyed {
		d.mu.Unlock()
		return rdmadev.ErrClosed
	}
	q.state = rdmadev.QPReset
	q.sq = nil
	q.dest = dest{}
	q.gen++
	if q.tmr != nil {
		q.tmr.Stop()
		q.tmr = nil
	}
	if destroy {
		q.destroyed = true
		delete(d.qps, q.num)
		d.st.qpsDestroyed.Add(1)
	}
	d.st.resets.Add(1)
	d.mu.Unlock()
	q.dma.Lock()
	q.dma.Unlock() //nolint:staticcheck // waits for the worker's batch in progress
	return nil
}

func (q *qp) State() (rdmadev.QPState, error) {
	d := q.d
	d.st.control.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.destroyed {
		return 0, rdmadev.ErrClosed
	}
	return q.state, nil
}

func (q *qp) Close() error {
	q.d.st.control.Add(1)
	return q.destroy()
}

func (q *qp) destroy() error { return q.reset(true) }

func (q *qp) PostSend(wrs []rdmadev.SendWR) (int, error) {
	d := q.d
	d.st.post.Add(1)
	d.mu.Lock()
	if q.destroyed {
		d.mu.Unlock()
		return 0, rdmadev.ErrClosed
	}
	switch q.state {
	case rdmadev.QPRTS, rdmadev.QPError:
	default:
		st := q.state
		d.mu.Unlock()
		return 0, fmt.Errorf("%w: post in %v", rdmadev.ErrBadState, st)
	}
	n := min(q.caps.MaxSendWR-len(q.sq), len(wrs))
	t := now()
	for _, wr := range wrs[:n] {
		p := pendingWR{wr: wr}
		if dl := d.delayLocked(q.num); dl > 0 {
			p.due = t.Add(dl)
		}
		q.sq = append(q.sq, p)
	}
	q.posted += uint64(n)
	d.mu.Unlock()
	d.st.posted.Add(uint64(n))
	if n > 0 {
		d.enqueue(q)
	}
	if n < len(wrs) {
		return n, fmt.Errorf("%w: %d of %d posted (max_send_wr %d)", rdmadev.ErrQueueFull, n, len(wrs), q.caps.MaxSendWR)
	}
	return n, nil
}

// process runs some of q's queued work on the worker: executes due work
// requests in order, or flushes them all when q is in ERR.
func (q *qp) process() {
	d := q.d
	q.dma.Lock()
	defer q.dma.Unlock()
	for round := 0; round < 4; round++ {
		d.mu.Lock()
		if q.destroyed || len(q.sq) == 0 {
			d.mu.Unlock()
			return
		}
		if d.hungLocked(q.num) {
			d.mu.Unlock()
			return // ClearFaults or removing the fault schedules it again
		}
		gen := q.gen
		if q.state == rdmadev.QPError {
			wcs := make([]rdmadev.Completion, len(q.sq))
			for i, p := range q.sq {
				wcs[i] = rdmadev.Completion{ID: p.wr.ID, Status: rdmadev.WCWRFlushErr, Op: p.wr.Op, QPN: q.num}
			}
			q.sq = nil
			d.st.flushed.Add(uint64(len(wcs)))
			q.cq.push(wcs)
			d.mu.Unlock()
			return
		}
		t := now()
		k := 0
		for k < len(q.sq) && k < 64 && !q.sq[k].due.After(t) {
			k++
		}
		if k == 0 {
			wait := q.sq[0].due.Sub(t)
			if q.tmr == nil {
				q.tmr = time.AfterFunc(wait, func() {
					d.mu.Lock()
					q.tmr = nil
					d.mu.Unlock()
					d.enqueue(q)
				})
			}
			d.mu.Unlock()
			return
		}
		batch := make([]pendingWR, k)
		copy(batch, q.sq)
		q.sq = q.sq[:copy(q.sq, q.sq[k:])]
		dst, pd := q.dest, q.pd
		d.mu.Unlock()

		wcs := make([]rdmadev.Completion, 0, k)
		failed := false
		for _, p := range batch {
			wc := rdmadev.Completion{ID: p.wr.ID, Op: p.wr.Op, QPN: q.num}
			if failed {
				wc.Status = rdmadev.WCWRFlushErr
				d.st.flushed.Add(1)
				wcs = append(wcs, wc)
				continue
			}
			st, drop := q.execute(p.wr, dst, pd)
			wc.Status = st
			if st == rdmadev.WCSuccess {
				wc.Bytes = p.wr.Length
			} else {
				failed = true
				d.st.errors.Add(1)
			}
			if drop {
				d.st.dropped.Add(1)
				continue
			}
			wcs = append(wcs, wc)
		}
		d.mu.Lock()
		if q.gen != gen {
			d.mu.Unlock()
			return // reset meanwhile: its completions are gone
		}
		if failed {
			q.state = rdmadev.QPError
		}
		q.cq.push(wcs)
		d.mu.Unlock()
	}
	d.enqueue(q)
}

// execute moves one work request's bytes, checking what an HCA checks.
// It returns the completion status and whether the completion is lost.
func (q *qp) execute(wr rdmadev.SendWR, dst dest, pd *pd) (rdmadev.WCStatus, bool) {
	d := q.d
	d.mu.Lock()
	f := d.takeLocked(q.num)
	localUp := d.port == rdmadev.PortActive
	lm := d.lkeys[wr.LKey]
	d.mu.Unlock()
	drop := false
	if f != nil {
		switch f.Kind {
		case FaultError:
			st := f.Status
			if st == rdmadev.WCSuccess {
				st = rdmadev.WCRetryExcErr
			}
			return st, false
		case FaultDrop:
			drop = true
		}
	}
	if !localUp {
		return rdmadev.WCRetryExcErr, drop
	}
	rd := d.f.lookup(dst.gid, dst.lid, dst.global)
	if rd == nil {
		return rdmadev.WCRetryExcErr, drop
	}
	need := rdmadev.AccessRemoteWrite
	if wr.Op == rdmadev.OpRead {
		need = rdmadev.AccessRemoteRead
	}
	rd.mu.Lock()
	rq := rd.qps[dst.qpn]
	switch {
	case rd.closed || rd.port != rdmadev.PortActive:
		rd.mu.Unlock()
		return rdmadev.WCRetryExcErr, drop
	case rq == nil || rq.state != rdmadev.QPRTR && rq.state != rdmadev.QPRTS || rq.dest.qpn != q.num || !sameAddr(rq.dest, d):
		// Nobody answers: the requester retries until it gives up.
		rd.mu.Unlock()
		return rdmadev.WCRetryExcErr, drop
	}
	if rq.access&need == 0 {
		rq.state = rdmadev.QPError
		rd.mu.Unlock()
		rd.enqueue(rq)
		return rdmadev.WCRemInvReqErr, drop
	}
	rm := rd.rkeys[wr.RKey]
	var rspan []byte
	ok := rm != nil && rm.pd == rq.pd && rm.access&need != 0
	if ok {
		rspan, ok = rm.span(wr.Remote, wr.Length)
	}
	if !ok {
		// An R_Key violation breaks the responder QP too.
		rq.state = rdmadev.QPError
		rd.mu.Unlock()
		rd.enqueue(rq)
		return rdmadev.WCRemAccessErr, drop
	}
	rd.mu.Unlock()

	if lm == nil || lm.pd != pd || wr.Op == rdmadev.OpRead && lm.access&rdmadev.AccessLocalWrite == 0 {
		return rdmadev.WCLocProtErr, drop
	}
	lspan, ok := lm.span(wr.Local, wr.Length)
	if !ok {
		return rdmadev.WCLocProtErr, drop
	}
	unlock := lockPair(lm, rm)
	defer unlock()
	if lm.dead {
		return rdmadev.WCLocProtErr, drop
	}
	if rm.dead {
		return rdmadev.WCRemAccessErr, drop
	}
	if wr.Op == rdmadev.OpRead {
		copy(lspan, rspan)
	} else {
		copy(rspan, lspan)
	}
	d.st.executed.Add(1)
	d.st.bytes.Add(uint64(wr.Length))
	return rdmadev.WCSuccess, drop
}

// sameAddr reports whether a responder's destination is device d.
func sameAddr(x dest, d *Device) bool {
	if x.global {
		return x.gid == d.gid
	}
	return x.lid == d.lid
}

// lockPair read-locks two MRs' dma locks in a fixed order (one lock when
// they are the same MR) and returns the unlock.
func lockPair(a, b *mr) func() {
	if a == b {
		a.dma.RLock()
		return a.dma.RUnlock
	}
	if uintptr(unsafe.Pointer(a)) > uintptr(unsafe.Pointer(b)) {
		a, b = b, a
	}
	a.dma.RLock()
	b.dma.RLock()
	return func() { b.dma.RUnlock(); a.dma.RUnlock() }
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }
