package local

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

// Dummy is a client of a real client on this host (Dial). Its methods
// mirror store.Client's; all are safe for concurrent use. When the
// connection breaks, calls in progress fail with ErrDisconnected and the
// next call dials again, registering anew (new token, the shared cache
// mapped again, registered pools passed again).
type Dummy struct {
	path string

	mu     sync.Mutex
	cur    *dconn
	pools  []*mempool.Pool
	closed bool
}

// Dial connects to the real client serving the Unix socket path and
// registers.
func Dial(ctx context.Context, path string) (*Dummy, error) {
	d := &Dummy{path: path}
	if _, err := d.conn(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// dconn is one registered connection.
type dconn struct {
	d      *Dummy
	f      *fconn
	tok    token
	wmu    sync.Mutex
	mu     sync.Mutex
	calls  map[uint64]chan reply
	nextID uint64
	dead   chan struct{}
	err    error
	shm    *mempool.Mapping // the shared cache, or nil
	vmu    sync.Mutex       // guards views, unmap and the mapping's end
	views  int              // Buffers of shm not released
	unmap  bool             // dead: unmap when views reach 0
	pools  map[*mempool.Pool]uint32
	wg     sync.WaitGroup
}

type reply struct {
	h    header
	body []byte
}

func (d *Dummy) conn(ctx context.Context) (*dconn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if d.cur != nil {
		select {
		case <-d.cur.dead:
			d.cur = nil
		default:
			return d.cur, nil
		}
	}
	dc, err := d.dial(ctx)
	if err != nil {
		return nil, err
	}
	d.cur = dc
	return dc, nil
}

func (d *Dummy) dial(ctx context.Context) (*dconn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", d.path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDisconnected, err)
	}
	dc := &dconn{d: d, f: newFconn(c.(*net.UnixConn)), calls: map[uint64]chan reply{}, dead: make(chan struct{}),
		pools: map[*mempool.Pool]uint32{}}
	ok := false
	defer func() {
		if !ok {
			c.Close()
			dc.f.closeFDs()
		}
	}()
	if dl, has := ctx.Deadline(); has {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(DefaultRecvTimeout))
	}
	e := newEnc(opHello, 1, token{})
	e.u32(protoVersion)
	if err := dc.f.write(e.frame(stOK), -1); err != nil {
		return nil, fmt.Errorf("%w: hello: %w", ErrDisconnected, err)
	}
	h, body, err := dc.f.read(0, DefaultRecvTimeout)
	if err != nil {
		return nil, fmt.Errorf("%w: hello: %w", ErrDisconnected, err)
	}
	dd := dec{b: body}
	if h.status != stOK {
		return nil, dd.errReply()
	}
	copy(dc.tok[:], dd.take(16, "token"))
	ping := time.Duration(dd.u32()) * time.Millisecond
	dd.u32() // expiry: the server's business
	shmSize, _ := dd.u64(), dd.u64()
	if err := dd.done(); err != nil {
		return nil, err
	}
	if shmSize > 0 {
		fd := dc.f.claimFD()
		if fd < 0 {
			return nil, fmt.Errorf("%w: shared cache announced without its descriptor", ErrProtocol)
		}
		m, err := mempool.Map(fd, int64(shmSize), mempool.MapOptions{})
		unix.Close(fd)
		if err != nil {
			return nil, err
		}
		dc.shm = m
	}
	dc.f.closeFDs()
	c.SetDeadline(time.Time{})
	ok = true
	dc.wg.Add(2)
	go dc.readLoop()
	go dc.pingLoop(max(ping, 10*time.Millisecond))
	for _, p := range d.pools {
		if err := dc.register(ctx, p); err != nil {
			dc.fail(err)
			return nil, err
		}
	}
	return dc, nil
}

func (dc *dconn) readLoop() {
	defer dc.wg.Done()
	for {
		h, body, err := dc.f.read(0, DefaultRecvTimeout)
		if err != nil {
			dc.fail(err)
			return
		}
		dc.mu.Lock()
		ch := dc.calls[h.id]
		delete(dc.calls, h.id)
		dc.mu.Unlock()
		if ch != nil {
			ch <- reply{h, body}
		}
	}
}

func (dc *dconn) pingLoop(every time.Duration) {
	defer dc.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-dc.dead:
			return
		case <-t.C:
			if err := dc.send(newEnc(opPing, 0, dc.tok), -1); err != nil {
				dc.fail(err)
				return
			}
		}
	}
}

// fail ends the connection: pending calls get ErrDisconnected.
func (dc *dconn) fail(err error) {
	dc.mu.Lock()
	select {
	case <-dc.dead:
		dc.mu.Unlock()
		return
	default:
	}
	dc.err = err
	close(dc.dead)
	dc.calls = map[uint64]chan reply{}
	dc.mu.Unlock()
	dc.f.c.Close()
	dc.vmu.Lock()
	dc.unmap = true
	dc.unmapLocked()
	dc.vmu.Unlock()
}

// holdShm counts a view of the shared cache and returns the mapping, or
// nil when there is none (any more).
func (dc *dconn) holdShm() []byte {
	dc.vmu.Lock()
	defer dc.vmu.Unlock()
	if dc.shm == nil {
		return nil
	}
	mem := dc.shm.Bytes()
	if mem != nil {
		dc.views++
	}
	return mem
}

func (dc *dconn) releaseShm() {
	dc.vmu.Lock()
	dc.views--
	dc.unmapLocked()
	dc.vmu.Unlock()
}

func (dc *dconn) unmapLocked() {
	if dc.shm != nil && dc.views == 0 && dc.unmap {
		dc.shm.Close()
	}
}

func (dc *dconn) send(e *enc, fd int) error {
	dc.wmu.Lock()
	defer dc.wmu.Unlock()
	return dc.f.write(e.frame(stOK), fd)
}

// call sends a request and waits for its reply body.
func (dc *dconn) call(ctx context.Context, e *enc, fd int) (dec, error) {
	if len(e.b)-4 > maxFrame {
		return dec{}, errcode.New(errcode.InvalidParams, "request of %d bytes over the frame limit %d: move large values through a registered pool", len(e.b), maxFrame)
	}
	ch := make(chan reply, 1)
	dc.mu.Lock()
	select {
	case <-dc.dead:
		dc.mu.Unlock()
		return dec{}, fmt.Errorf("%w: %w", ErrDisconnected, dc.err)
	default:
	}
	dc.nextID++
	id := dc.nextID
	dc.calls[id] = ch
	dc.mu.Unlock()
	h := header{op: e.b[4], id: id, tok: dc.tok}
	h.put(e.b)
	if err := dc.send(e, fd); err != nil {
		dc.fail(err)
		return dec{}, fmt.Errorf("%w: %w", ErrDisconnected, err)
	}
	select {
	case r := <-ch:
		d := dec{b: r.body}
		if r.h.status != stOK {
			return dec{}, d.errReply()
		}
		return d, nil
	case <-dc.dead:
		return dec{}, fmt.Errorf("%w: %w", ErrDisconnected, dc.err)
	case <-ctx.Done():
		dc.mu.Lock()
		delete(dc.calls, id)
		dc.mu.Unlock()
		return dec{}, errcode.New(errcode.RPCTimeout, "local call: %v", ctx.Err())
	}
}

// do runs one request on the current connection (dialling if needed).
func (d *Dummy) do(ctx context.Context, op byte, body func(e *enc, dc *dconn) error) (dec, *dconn, error) {
	dc, err := d.conn(ctx)
	if err != nil {
		return dec{}, nil, err
	}
	e := newEnc(op, 0, dc.tok)
	if err := body(e, dc); err != nil {
		return dec{}, nil, err
	}
	r, err := dc.call(ctx, e, -1)
	return r, dc, err
}

// Close disconnects: the real client drops everything this dummy held.
// Buffers still held stay readable until released.
func (d *Dummy) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	dc := d.cur
	d.cur = nil
	d.mu.Unlock()
	if dc != nil {
		dc.fail(ErrClosed)
		dc.wg.Wait()
	}
	return nil
}

// RegisterPool shares a pool's memory with the real client (its memfd,
// passed once): values in it are put and read with no copy through this
// socket (PutFrom, GetInto, BatchGetInto).
func (d *Dummy) RegisterPool(ctx context.Context, p *mempool.Pool) error {
	dc, err := d.conn(ctx)
	if err != nil {
		return err
	}
	if err := dc.register(ctx, p); err != nil {
		return err
	}
	d.mu.Lock()
	d.pools = append(d.pools, p)
	d.mu.Unlock()
	return nil
}

// UnregisterPool withdraws a pool given to RegisterPool; the real
// client unmaps it once requests using it are done.
func (d *Dummy) UnregisterPool(ctx context.Context, p *mempool.Pool) error {
	d.mu.Lock()
	i := slices.Index(d.pools, p)
	if i >= 0 {
		d.pools = slices.Delete(d.pools, i, i+1)
	}
	d.mu.Unlock()
	if i < 0 {
		return errcode.New(errcode.InvalidParams, "pool %q not registered", p.Name())
	}
	dc, err := d.conn(ctx)
	if err != nil {
		return err
	}
	dc.mu.Lock()
	id, ok := dc.pools[p]
	delete(dc.pools, p)
	dc.mu.Unlock()
	if !ok {
		return nil // registered on an earlier connection only: gone with it
	}
	e := newEnc(opUnregister, 0, dc.tok)
	e.u32(id)
	_, err = dc.call(ctx, e, -1)
	return err
}

func (dc *dconn) register(ctx context.Context, p *mempool.Pool) error {
	e := newEnc(opRegister, 0, dc.tok)
	e.u64(uint64(p.Size()))
	r, err := dc.call(ctx, e, p.Fd())
	if err != nil {
		return err
	}
	id := r.u32()
	if err := r.done(); err != nil {
		return err
	}
	dc.mu.Lock()
	dc.pools[p] = id
	dc.mu.Unlock()
	return nil
}

// registered reports whether b lies in a pool registered on dc.
func (dc *dconn) registered(b []byte) bool {
	_, _, p, ok := mempool.Lookup(b)
	if !ok || len(b) == 0 {
		return false
	}
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return dc.pools[p] != 0
}

// ref encodes b as a registered span when it lies in a registered pool,
// else inline (false when it must be inline and cannot be).
func (dc *dconn) ref(e *enc, b []byte, inline bool) error {
	if len(b) > 0 {
		if _, off, p, ok := mempool.Lookup(b); ok {
			dc.mu.Lock()
			id, has := dc.pools[p]
			dc.mu.Unlock()
			if has {
				e.u8(refRegion)
				e.u32(id)
				e.u64(uint64(off))
				e.u64(uint64(len(b)))
				return nil
			}
		}
	}
	if !inline {
		e.u8(refNone)
		return nil
	}
	if len(b) > MaxInline {
		return errcode.New(errcode.InvalidParams, "value of %d bytes over the inline limit %d: put it from a registered pool", len(b), MaxInline)
	}
	e.u8(refNone)
	e.bytes(b)
	return nil
}

// Put stores value under key.
func (d *Dummy) Put(ctx context.Context, key string, value []byte, rc store.ReplicateConfig) error {
	_, _, err := d.do(ctx, opPut, func(e *enc, dc *dconn) error {
		e.str(key)
		if err := dc.ref(e, value, true); err != nil {
			return err
		}
		encRC(e, rc)
		return nil
	})
	return err
}

// PutFrom is Put; from a registered pool the real client reads the value
// in place.
func (d *Dummy) PutFrom(ctx context.Context, key string, src []byte, rc store.ReplicateConfig) error {
	return d.Put(ctx, key, src, rc)
}

// Get returns a copy of the value under key.
func (d *Dummy) Get(ctx context.Context, key string) ([]byte, error) {
	r, _, err := d.do(ctx, opGet, func(e *enc, dc *dconn) error {
		e.str(key)
		e.u8(refNone)
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.u64()
	v := r.blob(MaxInline, "value")
	if err := r.done(); err != nil {
		return nil, err
	}
	return append([]byte(nil), v...), nil
}

// GetInto reads the value under key into dst and returns its size; into
// a registered pool the real client writes it in place.
func (d *Dummy) GetInto(ctx context.Context, key string, dst []byte) (int, error) {
	ns, errs := d.BatchGetInto(ctx, []string{key}, [][]byte{dst})
	return ns[0], errs[0]
}

// BatchGet is Get for many keys, answering per item.
func (d *Dummy) BatchGet(ctx context.Context, keys []string) ([][]byte, []error) {
	vals := make([][]byte, len(keys))
	_, errs := d.batchGet(ctx, keys, nil, vals)
	return vals, errs
}

// BatchGetInto is GetInto for many keys.
func (d *Dummy) BatchGetInto(ctx context.Context, keys []string, dsts [][]byte) ([]int, []error) {
	if len(dsts) != len(keys) {
		errs := make([]error, len(keys))
		for i := range errs {
			errs[i] = errcode.New(errcode.InvalidParams, "%d keys, %d buffers", len(keys), len(dsts))
		}
		return make([]int, len(keys)), errs
	}
	return d.batchGet(ctx, keys, dsts, nil)
}

func (d *Dummy) batchGet(ctx context.Context, keys []string, dsts, vals [][]byte) ([]int, []error) {
	ns, errs := make([]int, len(keys)), make([]error, len(keys))
	var inline []bool
	r, _, err := d.do(ctx, opBatchGet, func(e *enc, dc *dconn) error {
		e.u32(uint32(len(keys)))
		inline = make([]bool, len(keys))
		for i, k := range keys {
			e.str(k)
			if dsts == nil {
				e.u8(refNone)
				inline[i] = true
				continue
			}
			if dc.registered(dsts[i]) {
				dc.ref(e, dsts[i], false)
			} else {
				e.u8(refNone)
				inline[i] = true
			}
		}
		return nil
	})
	if err == nil && len(keys) > maxBatch {
		err = errcode.New(errcode.InvalidParams, "batch of %d keys (limit %d)", len(keys), maxBatch)
	}
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return ns, errs
	}
	if n := r.count(); n != len(keys) {
		r.fail("batch length")
	}
	for i := range keys {
		if errs[i] = r.itemErr(); errs[i] != nil {
			continue
		}
		ns[i] = int(r.u64())
		if !inline[i] {
			continue
		}
		v := r.blob(MaxInline, "value")
		switch {
		case vals != nil:
			vals[i] = append([]byte(nil), v...)
		case len(dsts[i]) < len(v):
			errs[i] = errcode.New(errcode.BufferOverflow, "%q: value of %d bytes, buffer of %d", keys[i], len(v), len(dsts[i]))
		default:
			copy(dsts[i], v)
		}
	}
	if err := r.done(); err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
	return ns, errs
}

// BatchPut is Put for many keys, answering per item.
func (d *Dummy) BatchPut(ctx context.Context, keys []string, values [][]byte, rc store.ReplicateConfig) []error {
	errs := make([]error, len(keys))
	if len(values) != len(keys) || len(keys) > maxBatch {
		for i := range errs {
			errs[i] = errcode.New(errcode.InvalidParams, "%d keys, %d values (limit %d)", len(keys), len(values), maxBatch)
		}
		return errs
	}
	r, _, err := d.do(ctx, opBatchPut, func(e *enc, dc *dconn) error {
		e.u32(uint32(len(keys)))
		for i, k := range keys {
			e.str(k)
			if err := dc.ref(e, values[i], true); err != nil {
				return err
			}
		}
		encRC(e, rc)
		return nil
	})
	return decErrs(r, err, errs)
}

func decErrs(r dec, err error, errs []error) []error {
	if err == nil {
		if n := r.count(); n != len(errs) {
			r.fail("batch length")
		}
		for i := range errs {
			errs[i] = r.itemErr()
		}
		err = r.done()
	}
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// IsExist reports whether key is stored (granting a read lease).
func (d *Dummy) IsExist(ctx context.Context, key string) (bool, error) {
	r, _, err := d.do(ctx, opExist, func(e *enc, dc *dconn) error { e.str(key); return nil })
	if err != nil {
		return false, err
	}
	ok := r.bool()
	return ok, r.done()
}

// BatchIsExist is IsExist for many keys.
func (d *Dummy) BatchIsExist(ctx context.Context, keys []string) ([]bool, []error) {
	oks, errs := make([]bool, len(keys)), make([]error, len(keys))
	r, _, err := d.do(ctx, opBatchExist, func(e *enc, dc *dconn) error {
		e.u32(uint32(len(keys)))
		for _, k := range keys {
			e.str(k)
		}
		return nil
	})
	if err == nil {
		if n := r.count(); n != len(keys) {
			r.fail("batch length")
		}
		for i := range keys {
			if errs[i] = r.itemErr(); errs[i] == nil {
				oks[i] = r.bool()
			}
		}
		err = r.done()
	}
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
	return oks, errs
}

// Remove deletes key (force: even while leased).
func (d *Dummy) Remove(ctx context.Context, key string, force bool) error {
	_, _, err := d.do(ctx, opRemove, func(e *enc, dc *dconn) error { e.str(key); e.bool(force); return nil })
	return err
}

// BatchRemove is Remove for many keys.
func (d *Dummy) BatchRemove(ctx context.Context, keys []string, force bool) []error {
	r, _, err := d.do(ctx, opBatchRemove, func(e *enc, dc *dconn) error {
		e.u32(uint32(len(keys)))
		for _, k := range keys {
			e.str(k)
		}
		e.bool(force)
		return nil
	})
	return decErrs(r, err, make([]error, len(keys)))
}

// Buffer is a value from GetBuffer: a view of the real client's shared
// cache (Shared) or a private copy. Release it; the real client does not
// reuse a block while a dummy holds it.
type Buffer struct {
	dc       *dconn
	mu       sync.Mutex
	b        []byte
	handle   uint64
	shared   bool
	deadline time.Time
}

// Bytes is the value (nil once released).
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b
}

// Shared reports whether the Buffer views shared memory (zero copy).
func (b *Buffer) Shared() bool { return b.shared }

// LeaseDeadline is the end of the read lease behind the bytes (zero for
// a private copy).
func (b *Buffer) LeaseDeadline() time.Time { return b.deadline }

// Release gives the buffer back; calling it again does nothing.
func (b *Buffer) Release() {
	b.mu.Lock()
	if b.b == nil {
		b.mu.Unlock()
		return
	}
	b.b = nil
	b.mu.Unlock()
	if !b.shared {
		return
	}
	dc := b.dc
	select {
	case <-dc.dead: // the server dropped our references with the session
	default:
		e := newEnc(opRelease, 0, dc.tok)
		e.u32(1)
		e.u64(b.handle)
		if err := dc.send(e, -1); err != nil {
			dc.fail(err)
		}
	}
	dc.releaseShm()
}

// Close is Release.
func (b *Buffer) Close() error { b.Release(); return nil }

// GetBuffer returns the value under key: from the shared hot cache a
// view with no copy, else a private copy.
func (d *Dummy) GetBuffer(ctx context.Context, key string) (*Buffer, error) {
	bs, errs := d.batchGetBuffer(ctx, []string{key}, opGetBuffer)
	return bs[0], errs[0]
}

// BatchGetBuffer is GetBuffer for many keys.
func (d *Dummy) BatchGetBuffer(ctx context.Context, keys []string) ([]*Buffer, []error) {
	return d.batchGetBuffer(ctx, keys, opBatchGetBuffer)
}

func (d *Dummy) batchGetBuffer(ctx context.Context, keys []string, op byte) ([]*Buffer, []error) {
	bs, errs := make([]*Buffer, len(keys)), make([]error, len(keys))
	r, dc, err := d.do(ctx, op, func(e *enc, dc *dconn) error {
		if op == opBatchGetBuffer {
			e.u32(uint32(len(keys)))
		}
		for _, k := range keys {
			e.str(k)
		}
		return nil
	})
	if err == nil && op == opBatchGetBuffer {
		if n := r.count(); n != len(keys) {
			r.fail("batch length")
		}
	}
	for i := range keys {
		if err != nil {
			break
		}
		if errs[i] = r.itemErr(); errs[i] != nil {
			continue
		}
		switch r.u8() {
		case refNone:
			v := append([]byte(nil), r.blob(MaxInline, "value")...)
			r.u64()
			bs[i] = &Buffer{dc: dc, b: v}
		case refShm:
			hd, off, n, dl := r.u64(), r.u64(), r.u64(), r.u64()
			if r.err != nil {
				break
			}
			mem := dc.holdShm() // counted before use: the mapping stays until released
			if off > uint64(len(mem)) || n > uint64(len(mem))-off {
				if mem != nil {
					dc.releaseShm()
				}
				r.err = fmt.Errorf("%w: view [%d, +%d) outside the shared cache (or it is gone)", ErrProtocol, off, n)
				break
			}
			bs[i] = &Buffer{dc: dc, b: mem[off : off+n : off+n], handle: hd, shared: true, deadline: time.Unix(0, int64(dl))}
		default:
			r.fail("view kind")
		}
	}
	if err == nil {
		err = r.done()
	}
	if err != nil {
		for i := range errs {
			if bs[i] != nil {
				bs[i].Release()
				bs[i] = nil
			}
			errs[i] = err
		}
	}
	return bs, errs
}

// Ping is one round trip to the real client (no master involved).
func (d *Dummy) Ping(ctx context.Context) error {
	_, _, err := d.do(ctx, opPing, func(*enc, *dconn) error { return nil })
	return err
}
