package efa

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/fabric"
)

// req is one task: its slices are ops on one domain. The first op lives
// in the req (one allocation for most tasks, recycled by reqPool).
type req struct {
	task      *transport.Task
	conn      *conn
	lreg      *localReg
	remaining int   // ops not yet ended; owned by the worker
	err       error // the first op error
	op0       op
}

var reqPool = sync.Pool{New: func() any { return new(req) }}

// newOp returns the request's next op: the embedded one first.
func (r *req) newOp() *op {
	r.remaining++
	if r.remaining == 1 {
		r.op0 = op{r: r}
		return &r.op0
	}
	return &op{r: r}
}

// op is one RMA operation (a slice of a task, or all of it).
type op struct {
	r         *req
	write     bool
	local     []byte
	mr        *fabric.MR
	remote    uint64
	key       uint64
	slot      uint32
	attempts  int
	notBefore time.Time // retry time
	expired   time.Time // when it was first seen past its deadline or aborted
	canceled  bool      // fi_cancel was asked
}

func (o *op) deadlinePassed(now time.Time) bool {
	d := o.r.task.Deadline
	return o.r.task.Aborted() || !d.IsZero() && !now.Before(d)
}

// worker drives one domain's endpoint on one goroutine: it posts queued
// operations in batches and drains the completion queue, sleeping on the
// queue's wait fd (through the Go netpoller) or polling with backoff. It
// never blocks inside C.
type worker struct {
	t    *Transport
	idx  int
	ep   *fabric.Endpoint
	info fabric.Info

	addrMu sync.RWMutex
	addr   []byte // the endpoint's name (changes on reset)

	qmu      sync.Mutex
	queue    []*op
	spare    []*op
	stopped  bool
	qlen     atomic.Int64
	wake     chan struct{}
	sleeping atomic.Bool
	file     *os.File // a duplicate of the CQ's wait fd, nil when polling
	raw      syscall.RawConn
	stop     chan struct{}
	done     chan struct{}
	started  bool
	loops    atomic.Uint64

	// Owned by run.
	pending  deque
	retry    []*op
	slots    []*op // posted ops by slot
	free     []uint32
	inflight int
	batch    []fabric.Op
	inBatch  []*op
	nextScan time.Time
	noReset  bool
	timer    *time.Timer
	errLog   time.Time
}

func newWorker(t *Transport, idx int, ep *fabric.Endpoint) (*worker, error) {
	w := &worker{
		t: t, idx: idx, ep: ep, info: ep.Info(), addr: ep.Name(),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		slots: make([]*op, ep.Slots()), batch: make([]fabric.Op, ep.MaxBatch()), inBatch: make([]*op, ep.MaxBatch()),
	}
	for i := ep.Slots() - 1; i >= 0; i-- {
		w.free = append(w.free, uint32(i))
	}
	w.timer = time.NewTimer(time.Hour)
	w.timer.Stop()
	if fd := ep.WaitFD(); fd >= 0 {
		if f, raw, ok := pollable(fd); ok {
			w.file, w.raw = f, raw
		}
	}
	return w, nil
}

// pollable wraps a duplicate of the wait fd for the Go netpoller; false
// when the netpoller cannot watch it.
func pollable(fd int) (*os.File, syscall.RawConn, bool) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, nil, false
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil, nil, false
	}
	f := os.NewFile(uintptr(dup), "fabric-cq-wait")
	if err := f.SetReadDeadline(time.Time{}); err != nil { // not in the netpoller
		f.Close()
		return nil, nil, false
	}
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, false
	}
	return f, raw, true
}

func (w *worker) address() []byte {
	w.addrMu.RLock()
	defer w.addrMu.RUnlock()
	return w.addr
}

// enqueue hands ops to the worker; after shutdown they end at once.
func (w *worker) enqueue(ops []*op) {
	w.qmu.Lock()
	if w.stopped {
		w.qmu.Unlock()
		for _, o := range ops {
			w.finish(o, transport.ErrClosed)
		}
		return
	}
	w.queue = append(w.queue, ops...)
	w.qlen.Add(int64(len(ops)))
	w.qmu.Unlock()
	w.kick()
}

// kick wakes the worker if it sleeps.
func (w *worker) kick() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
	if w.file != nil && w.sleeping.Load() {
		w.file.SetReadDeadline(time.Unix(1, 0))
	}
}

func (w *worker) take() {
	if w.qlen.Load() == 0 {
		return
	}
	w.qmu.Lock()
	q := w.queue
	w.queue, w.spare = w.spare[:0], q
	w.qlen.Store(0)
	w.qmu.Unlock()
	for i, o := range q {
		w.pending.pushBack(o)
		q[i] = nil
	}
}

func (w *worker) run() {
	defer close(w.done)
	idle := 0
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		w.loops.Add(1)
		now := time.Now()
		w.take()
		w.promote(now)
		if !now.Before(w.nextScan) {
			w.scan(now)
		}
		n := w.fill(now)
		res, comps, err := w.ep.Progress(w.batch[:n], w.file != nil && n == 0)
		if err != nil {
			w.logErr(err)
		}
		refused := w.posted(res, n, now)
		w.complete(comps, now)
		if res.EAGAIN > 0 {
			w.t.st.eagain.Add(uint64(res.EAGAIN))
		}
		if res.Posted > 0 || len(comps) > 0 || refused > 0 {
			idle = 0
			continue
		}
		idle++
		w.sleep(res, idle)
	}
}

// fill moves ops from the head of pending into the post batch, giving
// each a slot; ops whose task is over end here instead.
func (w *worker) fill(now time.Time) int {
	n := 0
	for n < len(w.batch) && w.pending.len() > 0 && len(w.free) > 0 {
		o := w.pending.popFront()
		if o.r.err != nil { // another slice failed: the task is lost anyway
			w.finish(o, nil)
			continue
		}
		if o.deadlinePassed(now) {
			w.finish(o, w.timeout(o))
			continue
		}
		slot := w.free[len(w.free)-1]
		w.free = w.free[:len(w.free)-1]
		w.slots[slot], o.slot = o, slot
		w.batch[n] = fabric.Op{Write: o.write, Local: o.local, MR: o.mr, Peer: o.r.conn.addr, Remote: o.remote, Key: o.key, Slot: slot}
		w.inBatch[n] = o
		n++
	}
	return n
}

// posted accounts for a Progress call's posting: refused ops end (or wait
// for a retry), ops not attempted go back to the head of pending.
func (w *worker) posted(res fabric.Result, n int, now time.Time) int {
	refused := 0
	for i := 0; i < res.Attempted; i++ {
		o := w.inBatch[i]
		if err := w.batch[i].Err; err != nil {
			w.unslot(o)
			refused++
			w.failed(o, err, now)
			continue
		}
		o.r.conn.progress = now
		w.inflight++
		w.t.st.ops.Add(1)
	}
	var stalled *conn
	if res.Attempted < n {
		if c := w.inBatch[res.Attempted].r.conn; now.Sub(c.progress) > w.t.cfg.PeerTimeout {
			stalled = c
		}
	}
	for i := n - 1; i >= res.Attempted; i-- {
		o := w.inBatch[i]
		w.unslot(o)
		w.pending.pushFront(o)
	}
	clear(w.inBatch[:n])
	for i := range w.batch[:n] {
		w.batch[i] = fabric.Op{}
	}
	if stalled != nil {
		refused += w.giveUp(stalled, now)
	}
	return refused
}

// giveUp fails the queued ops to a peer the provider has refused
// (EAGAIN) for PeerTimeout with nothing posted or completed: it went
// away. The next request connects anew.
func (w *worker) giveUp(c *conn, now time.Time) int {
	c.dead.Store(true)
	err := fmt.Errorf("efa: %w: %s took no operation for %v", transport.ErrPeerGone, c.pr.name, now.Sub(c.progress).Round(time.Millisecond))
	n := 0
	w.pending.filter(func(o *op) bool {
		if o.r.conn != c {
			return true
		}
		n++
		w.finish(o, err)
		return false
	})
	return n
}

func (w *worker) unslot(o *op) {
	w.slots[o.slot] = nil
	w.free = append(w.free, o.slot)
}

func (w *worker) complete(comps []fabric.Completion, now time.Time) {
	for _, c := range comps {
		if c.Slot == fabric.NoSlot || int(c.Slot) >= len(w.slots) || w.slots[c.Slot] == nil {
			if c.Err != nil {
				w.logErr(fmt.Errorf("efa: %s: error tied to no operation: %w", w.info.Domain, c.Err))
			}
			continue
		}
		o := w.slots[c.Slot]
		w.unslot(o)
		w.inflight--
		if c.Err == nil {
			o.r.conn.progress = now
		}
		if c.Err != nil {
			w.failed(o, c.Err, now)
			continue
		}
		w.finish(o, nil)
	}
}

// retryable errors are a connection that broke under the operation: the
// provider connects again on the next post.
func retryable(err error) bool {
	return errors.Is(err, fabric.ENOTCONN) || errors.Is(err, fabric.ECONNRESET) ||
		errors.Is(err, fabric.ECONNABORTED) || errors.Is(err, fabric.EPIPE)
}

// refused errors mean the peer's endpoint is gone: connect anew.
func refused(err error) bool {
	return errors.Is(err, fabric.ECONNREFUSED) || errors.Is(err, fabric.EHOSTUNREACH) || errors.Is(err, fabric.ENETUNREACH)
}

// failed handles an operation the provider failed: retried when its
// connection broke and time remains, else its task fails.
func (w *worker) failed(o *op, err error, now time.Time) {
	if retryable(err) && o.attempts < w.t.cfg.Retries && o.r.err == nil {
		delay := time.Duration(5*(o.attempts+1)*(o.attempts+1)) * time.Millisecond
		if d := o.r.task.Deadline; !o.r.task.Aborted() && (d.IsZero() || now.Add(delay).Before(d)) {
			o.attempts++
			o.notBefore = now.Add(delay)
			w.retry = append(w.retry, o)
			w.t.st.retries.Add(1)
			return
		}
	}
	if refused(err) {
		o.r.conn.dead.Store(true)
	}
	kind := "read"
	if o.write {
		kind = "write"
	}
	e := fmt.Errorf("efa: %s of %d bytes at %#x of %s via %s: %w", kind, len(o.local), o.remote, o.r.conn.pr.name, w.info.Domain, err)
	if retryable(err) || refused(err) {
		e = fmt.Errorf("%w: %w", transport.ErrPeerGone, e)
	}
	w.finish(o, e)
}

func (w *worker) timeout(o *op) error {
	return fmt.Errorf("%w: %s via %s", transport.ErrTimeout, o.r.conn.pr.name, w.info.Domain)
}

// finish ends one op; the last op of a request completes its task.
func (w *worker) finish(o *op, err error) {
	r := o.r
	if err != nil && r.err == nil {
		r.err = err
	}
	r.remaining--
	if r.remaining > 0 {
		return
	}
	r.conn.done()
	r.lreg.release()
	tk, err := r.task, r.err
	*r = req{}
	reqPool.Put(r)
	if err != nil {
		w.t.st.failed.Add(1)
		tk.Complete(0, err)
		return
	}
	w.t.st.completed.Add(1)
	tk.Complete(len(tk.Local), nil)
}

// promote moves retries that are due back to pending.
func (w *worker) promote(now time.Time) {
	if len(w.retry) == 0 {
		return
	}
	keep := w.retry[:0]
	for _, o := range w.retry {
		if now.Before(o.notBefore) {
			keep = append(keep, o)
			continue
		}
		w.pending.pushBack(o)
	}
	clear(w.retry[len(keep):])
	w.retry = keep
}

// scan ends queued ops whose task is over, asks the provider to cancel
// posted ones, and resets the endpoint when one stays posted StuckGrace
// past its deadline.
func (w *worker) scan(now time.Time) {
	w.nextScan = now.Add(5 * time.Millisecond)
	w.pending.filter(func(o *op) bool {
		if o.deadlinePassed(now) {
			w.finish(o, w.timeout(o))
			return false
		}
		return true
	})
	keep := w.retry[:0]
	for _, o := range w.retry {
		if o.deadlinePassed(now) {
			w.finish(o, w.timeout(o))
			continue
		}
		keep = append(keep, o)
	}
	clear(w.retry[len(keep):])
	w.retry = keep
	if w.inflight == 0 {
		return
	}
	stuck := 0
	for slot, o := range w.slots {
		if o == nil || !o.deadlinePassed(now) {
			continue
		}
		if o.expired.IsZero() {
			o.expired = now
		}
		if !o.canceled {
			o.canceled = true
			w.t.st.cancels.Add(1)
			w.ep.Cancel(uint32(slot)) // RMA is rarely cancelable; a canceled op completes with ECANCELED
		}
		if now.Sub(o.expired) >= w.t.cfg.StuckGrace {
			stuck++
		}
	}
	if stuck > 0 && !w.noReset {
		w.reset(now, stuck)
	}
}

// reset replaces the endpoint: closing it makes the provider drop every
// posted op, so their buffers can be released. Stuck ops end with
// ErrTimeout; the others are posted again if time remains.
func (w *worker) reset(now time.Time, stuck int) {
	comps, err := w.ep.Reset()
	if errors.Is(err, fabric.ErrNoReset) {
		w.noReset = true
		w.t.log.Warn("efa: operations never completed and the endpoint cannot be replaced; their buffers stay pinned until Close",
			"domain", w.info.Domain, "stuck", stuck)
		return
	}
	w.t.st.resets.Add(1) // before any task completes: tests read it then
	w.complete(comps, now)
	for _, o := range w.slots {
		if o == nil {
			continue
		}
		w.unslot(o)
		w.inflight--
		if o.deadlinePassed(now) {
			w.finish(o, fmt.Errorf("%w: the operation never completed; endpoint on %s reset", transport.ErrTimeout, w.info.Domain))
			continue
		}
		w.failed(o, fabric.ECONNRESET, now)
	}
	if err != nil {
		// No endpoint now: posts fail until Close.
		w.t.log.Error("efa: endpoint reset failed", "domain", w.info.Domain, "err", err)
		return
	}
	w.addrMu.Lock()
	w.addr = w.ep.Name()
	w.addrMu.Unlock()
	w.t.log.Warn("efa: endpoint reset after operations never completed", "domain", w.info.Domain, "stuck", stuck)
}

// sleep waits for something to do after a round that did nothing.
func (w *worker) sleep(res fabric.Result, idle int) {
	busy := w.inflight > 0 || w.pending.len() > 0 || len(w.retry) > 0
	switch {
	case res.EAGAIN > 0 || len(w.retry) > 0 || w.pending.len() > 0 && len(w.free) > 0:
		// Back-pressure, a connection being set up, or retries: poll.
		w.backoff(idle, time.Millisecond)
	case w.file != nil:
		if !res.MayWait {
			// fi_trywait asks for another progress call first (the
			// provider has internal work, such as connection set-up).
			w.backoff(idle, time.Millisecond)
			return
		}
		timeout := 200 * time.Millisecond
		if busy {
			timeout = 10 * time.Millisecond // a safety net: completions wake the fd
		}
		w.waitFD(timeout)
	case busy || w.info.Progress == fabric.ProgressManual:
		// No wait fd: poll; a manual-progress provider needs calls to move
		// data even for peers' operations on our memory.
		w.backoff(idle, time.Millisecond)
	default:
		w.block(100 * time.Millisecond)
	}
}

// backoff yields for the first rounds, then sleeps up to max (woken by
// new work).
func (w *worker) backoff(idle int, max time.Duration) {
	const spin = 16
	if idle < spin {
		runtime.Gosched()
		return
	}
	d := time.Duration(1<<min(idle-spin, 20)) * time.Microsecond
	w.block(min(d, max))
}

func (w *worker) block(d time.Duration) {
	if w.qlen.Load() > 0 {
		return
	}
	w.timer.Reset(d)
	select {
	case <-w.wake:
	case <-w.stop:
	case <-w.timer.C:
	}
	w.timer.Stop()
}

// waitFD sleeps until the wait fd is readable, new work arrives (kick) or
// the timeout passes.
func (w *worker) waitFD(timeout time.Duration) {
	w.file.SetReadDeadline(time.Now().Add(timeout))
	w.sleeping.Store(true)
	if w.qlen.Load() == 0 {
		select {
		case <-w.stop:
		default:
			w.raw.Read(func(fd uintptr) bool { return readable(int(fd)) })
		}
	}
	w.sleeping.Store(false)
	select {
	case <-w.wake:
	default:
	}
}

func readable(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 0)
	return err == nil && n > 0
}

func (w *worker) logErr(err error) {
	if errors.Is(err, fabric.ErrClosed) {
		return
	}
	if now := time.Now(); now.After(w.errLog) {
		w.errLog = now.Add(10 * time.Second)
		w.t.log.Error("efa: completion queue error", "domain", w.info.Domain, "err", err)
	}
}

// shutdown stops the worker, closes the endpoint (the provider lets go of
// every buffer) and ends every op with ErrClosed.
func (w *worker) shutdown() error {
	if w.started {
		close(w.stop)
		w.kick()
		<-w.done
	}
	w.qmu.Lock()
	w.stopped = true
	q := w.queue
	w.queue = nil
	w.qmu.Unlock()
	err := w.ep.Close()
	for _, o := range w.slots {
		if o != nil {
			w.unslot(o)
			w.finish(o, transport.ErrClosed)
		}
	}
	w.inflight = 0
	for w.pending.len() > 0 {
		w.finish(w.pending.popFront(), transport.ErrClosed)
	}
	for _, o := range append(w.retry, q...) {
		w.finish(o, transport.ErrClosed)
	}
	w.retry = nil
	if w.file != nil {
		w.file.Close()
	}
	return err
}

// deque is a FIFO of ops that can also push at the front.
type deque struct {
	buf  []*op
	head int
	n    int
}

func (d *deque) len() int { return d.n }

func (d *deque) grow() {
	nb := make([]*op, max(16, 2*len(d.buf)))
	for i := 0; i < d.n; i++ {
		nb[i] = d.buf[(d.head+i)%len(d.buf)]
	}
	d.buf, d.head = nb, 0
}

func (d *deque) pushBack(o *op) {
	if d.n == len(d.buf) {
		d.grow()
	}
	d.buf[(d.head+d.n)%len(d.buf)] = o
	d.n++
}

func (d *deque) pushFront(o *op) {
	if d.n == len(d.buf) {
		d.grow()
	}
	d.head = (d.head - 1 + len(d.buf)) % len(d.buf)
	d.buf[d.head] = o
	d.n++
}

func (d *deque) popFront() *op {
	o := d.buf[d.head]
	d.buf[d.head] = nil
	d.head = (d.head + 1) % len(d.buf)
	d.n--
	return o
}

// filter keeps the ops for which keep is true, in order.
func (d *deque) filter(keep func(*op) bool) {
	n := d.n
	for i := 0; i < n; i++ {
		o := d.popFront()
		if keep(o) {
			d.pushBack(o)
		}
	}
}
