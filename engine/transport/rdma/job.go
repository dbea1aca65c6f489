package rdma

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// job is one Task: a run of slices that complete it together.
type job struct {
	task     *transport.Task
	ps       *peerState
	reg      *region
	rbuf     *peerBuf
	lp, rp   prefs // NIC preferences of the local and the remote buffer
	op       rdmadev.Opcode
	local    uint64
	remote   uint64
	deadline time.Time

	remaining atomic.Int32
	bytes     atomic.Int64
	mu        sync.Mutex
	err       error
}

// expired reports a job whose owner stopped waiting or whose deadline
// passed: its slices are not started any more, and posted ones are
// flushed.
func (j *job) expired(now time.Time) bool {
	return j.task.Aborted() || !j.deadline.IsZero() && !now.Before(j.deadline)
}

// done ends one slice; the last one completes the task.
func (j *job) done(s *slice, err error) {
	if err == nil {
		j.bytes.Add(int64(s.length))
	} else {
		j.mu.Lock()
		if j.err == nil {
			j.err = err
		}
		j.mu.Unlock()
	}
	if j.remaining.Add(-1) != 0 {
		return
	}
	j.mu.Lock()
	err = j.err
	j.mu.Unlock()
	// Complete before releasing the region: an unregister waiting for it
	// must find the completion already delivered.
	j.task.Complete(int(j.bytes.Load()), err)
	j.reg.release()
}

func (j *job) timeoutErr() error {
	if j.task.Aborted() {
		return fmt.Errorf("%w: request abandoned by its owner", transport.ErrTimeout)
	}
	return fmt.Errorf("%w: rdma slice not completed by the deadline", transport.ErrTimeout)
}

// slice is one work request's worth of a job.
type slice struct {
	j       *job
	off     uint64
	length  uint32
	lnic    int // current path: local NIC index
	rnic    int // and peer NIC index
	retries int

	// Set under the NIC's mu while posted.
	ep *endpoint
	qp int
	id uint64
}

func (s *slice) wr() rdmadev.SendWR {
	j := s.j
	return rdmadev.SendWR{ID: s.id, Op: j.op, Local: j.local + s.off, Length: s.length, LKey: j.reg.lkeys[s.lnic],
		Remote: j.remote + s.off, RKey: j.rbuf.rkeys[s.rnic]}
}

// usable returns the path filter for one peer: local port up, pair not
// paused.
func (t *Transport) usable(ps *peerState, now time.Time) pathFunc {
	return func(l, r int) bool {
		return t.nics[l].up.Load() && !t.health.isPaused(pairKey{l, ps.nics[r].path}, now)
	}
}

// anyPath reports whether some pair to the peer may carry traffic.
func (t *Transport) anyPath(ps *peerState) bool {
	ok := t.usable(ps, time.Now())
	for l := range t.nics {
		for r := range ps.nics {
			if ok(l, r) {
				return true
			}
		}
	}
	return false
}

// Submit implements transport.Transport. It never waits for the
// network: slices go to their endpoints' queues and are posted at once
// when the endpoint is connected (one PostSend per QP per call).
func (t *Transport) Submit(p transport.Peer, tasks []*transport.Task) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		for _, tk := range tasks {
			tk.Complete(0, transport.ErrClosed)
		}
		return
	}
	ps := t.peer(p)
	now := time.Now()
	ok := t.usable(ps, now)
	out := make([]*slice, 0, len(tasks))
	for _, tk := range tasks {
		n := uint64(len(tk.Local))
		switch {
		case tk.Aborted():
			tk.Complete(0, fmt.Errorf("%w: request abandoned before it started", transport.ErrTimeout))
			continue
		case ps.err != nil:
			tk.Complete(0, fmt.Errorf("%w: %w", transport.ErrUnreachable, ps.err))
			continue
		case n == 0:
			tk.Complete(0, nil)
			continue
		}
		rb := ps.find(tk.RemoteAddr, n)
		if rb == nil {
			tk.Complete(0, fmt.Errorf("%w: [%#x,%#x) of %s has no rdma keys", transport.ErrOutOfBounds, tk.RemoteAddr, tk.RemoteAddr+n, ps.name))
			continue
		}
		local := transport.AddrOf(tk.Local)
		reg := t.regs.find(local, n)
		if reg == nil || !reg.acquire() {
			tk.Complete(0, fmt.Errorf("%w: local [%#x,+%d) has no memory region", transport.ErrNotRegistered, local, n))
			continue
		}
		op := rdmadev.OpWrite
		if tk.Op == transport.Read {
			op = rdmadev.OpRead
		}
		j := &job{task: tk, ps: ps, reg: reg, rbuf: rb, lp: t.local.lookup(reg.loc), rp: ps.matrix.lookup(rb.loc),
			op: op, local: local, remote: tk.RemoteAddr, deadline: tk.Deadline}
		size := uint64(t.cfg.SliceSize)
		cnt := (n + size - 1) / size
		ss := make([]slice, cnt)
		j.remaining.Store(int32(cnt))
		for i := range ss {
			s := &ss[i]
			s.j, s.off = j, uint64(i)*size
			s.length = uint32(min(size, n-s.off))
			l, r, found := choosePath(j.lp, j.rp, t.ctr.Add(1), 0, -1, -1, ok)
			if !found {
				t.st.failed.Add(1)
				j.done(s, ErrNoPath)
				continue
			}
			s.lnic, s.rnic = l, r
			out = append(out, s)
		}
	}
	t.dispatch(out)
}

// dispatch hands slices to the endpoints of their paths, one enqueue
// and one kick per endpoint.
func (t *Transport) dispatch(ss []*slice) {
	for len(ss) > 0 {
		// Group by (peer, local NIC, peer NIC); batches rarely hold more
		// than a few groups, so a linear scan beats a map.
		head := ss[0]
		group := ss[:0:0]
		rest := ss[:0]
		for _, s := range ss {
			if s.j.ps == head.j.ps && s.lnic == head.lnic && s.rnic == head.rnic {
				group = append(group, s)
			} else {
				rest = append(rest, s)
			}
		}
		ss = rest
		t.endpointFor(head.j.ps, head.lnic, head.rnic, group).kick()
	}
}

// resend routes slices again after their endpoint failed. counted
// marks a retry after an error on the path: it uses up one of
// MaxRetries and avoids the failed pair. Slices of expired jobs end
// with ErrTimeout instead.
func (t *Transport) resend(ss []*slice, counted bool, cause error) {
	if len(ss) == 0 {
		return
	}
	now := time.Now()
	out := ss[:0:0]
	for _, s := range ss {
		j := s.j
		switch {
		case j.expired(now):
			j.done(s, j.timeoutErr())
			continue
		case t.stopping():
			j.done(s, transport.ErrClosed)
			continue
		case j.ps.closed.Load():
			j.done(s, fmt.Errorf("%w: segment %s closed", transport.ErrPeerGone, j.ps.name))
			continue
		}
		avoidL, avoidR := -1, -1
		if counted {
			if s.retries >= t.cfg.MaxRetries {
				t.st.failed.Add(1)
				j.done(s, fmt.Errorf("rdma: slice failed after %d attempts: %w", s.retries+1, cause))
				continue
			}
			s.retries++
			t.st.retried.Add(1)
			avoidL, avoidR = s.lnic, s.rnic
		}
		l, r, found := choosePath(j.lp, j.rp, t.ctr.Add(1), s.retries, avoidL, avoidR, t.usable(j.ps, now))
		if !found {
			t.st.failed.Add(1)
			if cause != nil {
				j.done(s, fmt.Errorf("%w (last error: %w)", ErrNoPath, cause))
			} else {
				j.done(s, ErrNoPath)
			}
			continue
		}
		s.lnic, s.rnic = l, r
		out = append(out, s)
	}
	t.dispatch(out)
}

// errFlushed marks an endpoint whose QP went to ERR by itself (an
// asynchronous error): its work was flushed.
var errFlushed = errors.New("rdma: queue pair flushed")

// complete handles one completion of slice s; slices to route again are
// appended to redo (dispatched by the caller, in one go).
func (t *Transport) complete(s *slice, status rdmadev.WCStatus, vendor uint32, redo, retry *[]*slice, lastErr *error) {
	ep := s.ep
	failing, drained := ep.retire(s.qp)
	switch {
	case status == rdmadev.WCSuccess:
		t.st.completed.Add(1)
		s.j.done(s, nil)
	case status == rdmadev.WCWRFlushErr, failing:
		// An endpoint already out of service loses its work (flushed, or
		// failing because its peer dropped the QPs): not news.
		*redo = append(*redo, ep.fail(errFlushed)...)
		*redo = append(*redo, s)
	default:
		t.st.wcErrors.Add(1)
		cerr := &CompletionError{Status: status, VendorErr: vendor, Op: s.j.op, Local: ep.n.path, Peer: ep.peerPath, Remote: s.j.remote + s.off}
		*redo = append(*redo, ep.fail(cerr)...)
		if requestError(status) {
			t.st.failed.Add(1)
			s.j.done(s, cerr)
			break
		}
		t.pairError(ep.n, ep.peerPath)
		*retry = append(*retry, s)
		*lastErr = cerr
	}
	if drained {
		ep.destroy()
	}
}

// pairError counts an error against a rail and checks the local port.
func (t *Transport) pairError(n *nic, peerPath string) {
	if t.health.record(pairKey{n.idx, peerPath}, time.Now()) {
		t.log.Warn("rdma: NIC pair paused after repeated errors", "local", n.path, "peer", peerPath,
			"errors", t.cfg.PauseErrors, "window", t.cfg.PauseWindow, "pause", t.cfg.PauseFor)
	}
	t.checkPort(n)
}
