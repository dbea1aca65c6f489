package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/storepb"
)

// replicaRef is a readable replica: size bytes at addr of segment seg.
type replicaRef struct {
	seg  string
	addr uint64
}

// located is an object ready to be read: its size, its replicas in the
// order to try them, and the lease deadline.
type located struct {
	size     uint64
	reps     []replicaRef
	deadline time.Time
}

// chooseReplicas orders the complete memory replicas: this client's own
// segment first (a plain copy), then segments on this host (shm), then
// the rest in the master's order.
func (c *Client) chooseReplicas(key string, reps []*storepb.ReplicaDescriptor) (uint64, []replicaRef, error) {
	return c.chooseReplicasInto(key, reps, nil)
}

// Replica classes, in the order reads try them.
const (
	replicaOwn   = iota // this client's segment
	replicaHost         // another segment on this host
	replicaOther        // elsewhere
	replicaSkip         // not a complete memory replica
)

// chooseReplicasInto is chooseReplicas appending the order to dst, so a
// batch describes all its items in one array: the order it returns is
// dst's new tail, with dst's spare capacity after it.
func (c *Client) chooseReplicasInto(key string, reps []*storepb.ReplicaDescriptor, dst []replicaRef) (uint64, []replicaRef, error) {
	var size uint64
	pending := false
	var small [4]uint8
	classes := small[:0]
	if len(reps) > len(small) {
		classes = make([]uint8, 0, len(reps))
	}
	for _, r := range reps {
		m := r.GetMemory()
		class := uint8(replicaSkip)
		switch {
		case r.Type != storepb.ReplicaType_REPLICA_TYPE_MEMORY || m == nil:
		case r.Status != storepb.ReplicaStatus_REPLICA_STATUS_COMPLETE:
			pending = true
		default:
			if size == 0 {
				size = m.Size
			} else if m.Size != size {
				return 0, nil, errcode.New(errcode.InvalidReplica, "%q: replicas of %d and %d bytes", key, size, m.Size)
			}
			switch h, _, _ := net.SplitHostPort(m.SegmentName); {
			case m.SegmentName == c.name && c.isLocal(m.BufferAddress, m.Size):
				class = replicaOwn
			case h != "" && h == c.host:
				class = replicaHost
			default:
				class = replicaOther
			}
		}
		classes = append(classes, class)
	}
	start := len(dst)
	for class := range uint8(replicaSkip) {
		for i, r := range reps {
			if classes[i] == class {
				m := r.GetMemory()
				dst = append(dst, replicaRef{seg: m.SegmentName, addr: m.BufferAddress})
			}
		}
	}
	out := dst[start:]
	switch {
	case len(out) > 0 && size == 0:
		return 0, nil, errcode.New(errcode.InvalidReplica, "%q: replica of 0 bytes", key)
	case len(out) > 0 && size > hostMemory():
		// Sized by the master's answer: a corrupt one must not panic
		// (makeslice) or abort (out of memory) the embedding process.
		return 0, nil, errcode.New(errcode.InvalidReplica, "%q: replica of %d bytes, more than this host's memory (%d)", key, size, hostMemory())
	case len(out) > 0:
		return size, out, nil
	case pending:
		return 0, nil, errcode.New(errcode.ReplicaIsNotReady, "%q", key)
	case len(reps) == 0:
		return 0, nil, errcode.New(errcode.ObjectNotFound, "%q: no replica", key)
	}
	return 0, nil, errcode.New(errcode.InvalidReplica, "%q: no memory replica", key)
}

// hostMemory is this host's RAM, the most a value read here can be.
var hostMemory = sync.OnceValue(func() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil || si.Totalram == 0 {
		return math.MaxUint64 // unknown: no bound
	}
	return uint64(si.Totalram) * uint64(si.Unit)
})

func (c *Client) isLocal(addr, n uint64) bool {
	_, ok := c.localSlice(c.name, addr, n)
	return ok
}

// locate asks the master where key is, granting a lease. The lease runs
// from before the request left, as the reference client counts it.
func (c *Client) locate(ctx context.Context, key string) (located, error) {
	if err := c.checkKey(key); err != nil {
		return located{}, err
	}
	start := c.clock.Now()
	res, err := c.gets.do(ctx, key)
	if err != nil {
		return located{}, err
	}
	size, reps, err := c.chooseReplicas(key, res.replicas)
	if err != nil {
		return located{}, err
	}
	return located{size: size, reps: reps, deadline: start.Add(res.leaseTTL)}, nil
}

// locateCached is locate through the location cache: a cached location
// (cached true) when one may be used, else the master's answer, which is
// then cached.
func (c *Client) locateCached(ctx context.Context, key string) (loc located, cached bool, err error) {
	if c.loc == nil {
		loc, err = c.locate(ctx, key)
		return loc, false, err
	}
	if err := c.checkKey(key); err != nil {
		return located{}, false, err
	}
	if c.locWatch.Fresh() {
		if loc, ok := c.cachedLoc(key, c.clock.Now()); ok {
			return loc, true, nil
		}
	}
	c.stats.locMisses.Add(1)
	epoch, start := c.loc.epoch(key), c.clock.Now()
	if loc, err = c.locate(ctx, key); err == nil {
		c.loc.put(key, loc, start, epoch)
	}
	return loc, false, err
}

// cachedLoc is key's cached location at now, counting a hit.
func (c *Client) cachedLoc(key string, now time.Time) (located, bool) {
	loc, ok := c.loc.get(key, now)
	if ok {
		c.stats.locHits.Add(1)
	}
	return loc, ok
}

// withLocation runs read on where key is. When the location came from
// the cache and read fails (the object moved, the lease ran short), the
// entry is dropped and read runs once more on the master's answer.
func (c *Client) withLocation(ctx context.Context, key string, read func(located) error) error {
	loc, cached, err := c.locateCached(ctx, key)
	if err != nil {
		return err
	}
	if err = read(loc); err == nil || !cached || ctx.Err() != nil {
		return err
	}
	c.loc.drop(key)
	if loc, _, err = c.locateCached(ctx, key); err != nil {
		return err
	}
	return read(loc)
}

// checkLease fails with LEASE_EXPIRED when the read ended after the lease:
// the master may have evicted the object and reused its space meanwhile.
func (c *Client) checkLease(key string, deadline time.Time) error {
	if c.afterRead != nil {
		c.afterRead()
	}
	return c.checkLeaseAt(key, deadline, c.clock.Now())
}

// checkLeaseAt is checkLease with the clock read (after the read ended).
func (c *Client) checkLeaseAt(key string, deadline, now time.Time) error {
	if now.After(deadline) {
		return errcode.New(errcode.LeaseExpired, "%q: read ended %v after the lease", key, now.Sub(deadline))
	}
	return nil
}

// readable returns nil when one of loc's replicas lies in memory its
// segment registered (this client's own, or per the segment's
// descriptor): the size comes from the master, and a wrong one must cost
// an error before a buffer that size is allocated, not after.
func (c *Client) readable(ctx context.Context, key string, loc located) error {
	var err error
	for _, r := range loc.reps {
		if _, ok := c.localSlice(r.seg, r.addr, loc.size); ok {
			return nil
		}
		id, e := c.segmentID(ctx, r.seg)
		if e != nil {
			err = fmt.Errorf("%w: segment %s: %w", errcode.ErrTransferFail, r.seg, e)
			continue
		}
		if e = c.eng.CheckRange(ctx, id, r.addr, loc.size); e == nil {
			return nil
		} else if errors.Is(e, engine.ErrOutOfBounds) {
			e = errcode.New(errcode.InvalidReplica, "%q: replica of %d bytes: %v", key, loc.size, e)
		}
		err = e
	}
	return err
}

// read fills dst from the first replica that can be read.
func (c *Client) read(ctx context.Context, reps []replicaRef, dst []byte) error {
	var err error
	for _, r := range reps {
		x := &xfer{op: engine.Read, buf: dst, seg: r.seg, addr: r.addr}
		c.transfer(ctx, []*xfer{x})
		if x.err == nil {
			return nil
		}
		err = x.err
		if ctx.Err() != nil {
			break
		}
	}
	return err
}

// Get returns a copy of the value stored under key.
func (c *Client) Get(ctx context.Context, key string) (v []byte, err error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.leave()
	defer c.observeGet(time.Now(), &err)
	err = c.withLocation(ctx, key, func(loc located) error {
		if err := c.readable(ctx, key, loc); err != nil {
			return err
		}
		v = make([]byte, loc.size)
		if err := c.read(ctx, loc.reps, v); err != nil {
			return err
		}
		return c.checkLease(key, loc.deadline)
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// GetInto reads the value stored under key into dst and returns its size.
// dst shorter than the value is BUFFER_OVERFLOW. When dst lies in
// registered memory the replica is read straight into it, with no copy.
// After an error dst's contents are undefined.
func (c *Client) GetInto(ctx context.Context, key string, dst []byte) (n int, err error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.leave()
	defer c.observeGet(time.Now(), &err)
	err = c.withLocation(ctx, key, func(loc located) error {
		if uint64(len(dst)) < loc.size {
			return errcode.New(errcode.BufferOverflow, "%q: value of %d bytes, buffer of %d", key, loc.size, len(dst))
		}
		if err := c.read(ctx, loc.reps, dst[:loc.size]); err != nil {
			return err
		}
		n = int(loc.size)
		return c.checkLease(key, loc.deadline)
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

func (c *Client) observeGet(start time.Time, err *error) {
	c.stats.getLat.observe(time.Since(start))
	countOps(&c.stats.gets, &c.stats.getFail, 1, btoi(*err != nil))
}

// Buffer is a value returned by GetBuffer: a view of the bytes plus a
// release. Release it when done; its memory then goes back to the client.
type Buffer struct {
	c        *Client
	mu       sync.Mutex
	b        []byte
	pooled   []byte // staging allocation to give back
	mapped   bool   // b points into the client's memory
	local    bool
	deadline time.Time
}

// Bytes returns the value, or nil once released. A local view (Local())
// shows the replica in place: it is guaranteed unchanged only until
// LeaseDeadline, after which the master may evict the object and let a
// writer reuse the space.
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b
}

// Len is the value's size (0 once released).
func (b *Buffer) Len() int { return len(b.Bytes()) }

// Local reports whether the Buffer views a replica in this client's own
// segment, in place.
func (b *Buffer) Local() bool { return b.local }

// Mapped reports whether Bytes lies in the client's own memory (its
// segment or staging pool) rather than the Go heap, so it may be shown
// to C (the C ABI copies heap buffers instead).
func (b *Buffer) Mapped() bool { return b.mapped }

// LeaseDeadline is when the read lease granted for this value ends.
func (b *Buffer) LeaseDeadline() time.Time { return b.deadline }

// Release gives the buffer back. Calling it again does nothing.
func (b *Buffer) Release() {
	b.mu.Lock()
	if b.b == nil {
		b.mu.Unlock()
		return
	}
	b.b = nil
	pooled, mapped := b.pooled, b.mapped
	b.pooled = nil
	b.mu.Unlock()
	if pooled != nil {
		b.c.stage.freeView(pooled)
	}
	if mapped {
		b.c.dropView()
	}
}

// Close is Release, for io.Closer.
func (b *Buffer) Close() error {
	b.Release()
	return nil
}

// holdView keeps the client's memory mapped for a Buffer.
func (c *Client) holdView() {
	c.bufMu.Lock()
	c.views++
	c.bufMu.Unlock()
}

func (c *Client) dropView() {
	c.bufMu.Lock()
	c.views--
	unmap := c.views == 0 && c.memOff
	idle := c.views == 0
	c.bufMu.Unlock()
	if unmap {
		c.unmapMemory()
	} else if idle {
		c.unmapDrained()
	}
}

// GetBuffer returns the value under key as a Buffer: a replica in this
// client's own segment is viewed in place (no copy); otherwise it is read
// into a buffer from the staging pool (a heap buffer when the pool is
// short). The caller must Release it.
func (c *Client) GetBuffer(ctx context.Context, key string) (buf *Buffer, err error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.leave()
	defer c.observeGet(time.Now(), &err)
	err = c.withLocation(ctx, key, func(loc located) error {
		buf, err = c.readBuffer(ctx, key, loc)
		return err
	})
	if err != nil {
		return nil, err
	}
	return buf, nil
}

// readBuffer is GetBuffer's read of the object at loc.
func (c *Client) readBuffer(ctx context.Context, key string, loc located) (*Buffer, error) {
	if mem, ok := c.localSlice(loc.reps[0].seg, loc.reps[0].addr, loc.size); ok {
		if err := c.checkLease(key, loc.deadline); err != nil {
			return nil, err
		}
		c.holdView()
		c.stats.read.Add(loc.size)
		return &Buffer{c: c, b: mem, mapped: true, local: true, deadline: loc.deadline}, nil
	}
	buf := &Buffer{c: c, deadline: loc.deadline}
	if p := c.stage.allocView(int(loc.size)); p != nil {
		c.holdView()
		buf.b, buf.pooled, buf.mapped = p, p, true
	} else {
		if err := c.readable(ctx, key, loc); err != nil {
			return nil, err
		}
		buf.b = make([]byte, loc.size)
	}
	if err := c.read(ctx, loc.reps, buf.b); err != nil {
		buf.Release()
		return nil, err
	}
	if err := c.checkLease(key, loc.deadline); err != nil {
		buf.Release()
		return nil, err
	}
	return buf, nil
}

// BatchGet returns the values under keys, answering per item. The reads of
// all items move in shared engine batches; an item whose replica cannot be
// read is retried on its next replica.
func (c *Client) BatchGet(ctx context.Context, keys []string) ([][]byte, []error) {
	return c.batchGet(ctx, keys, nil)
}

// BatchGetInto is BatchGet into caller-owned buffers: the value under
// keys[i] is read into dsts[i] (BUFFER_OVERFLOW when shorter) and ns[i] is
// its size. When the buffers lie in registered memory (RegisterBuffer)
// the replicas are read straight into them, with no copy. After an error
// an item's buffer contents are undefined.
func (c *Client) BatchGetInto(ctx context.Context, keys []string, dsts [][]byte) (ns []int, errs []error) {
	ns = make([]int, len(keys))
	if len(dsts) != len(keys) {
		errs = make([]error, len(keys))
		fill(errs, errcode.New(errcode.InvalidParams, "%d keys, %d buffers", len(keys), len(dsts)))
		return ns, errs
	}
	vals, errs := c.batchGet(ctx, keys, dsts)
	for i, v := range vals {
		ns[i] = len(v)
	}
	return ns, errs
}

// batchGet is BatchGet, reading into into[i] when into is not nil.
func (c *Client) batchGet(ctx context.Context, keys []string, into [][]byte) ([][]byte, []error) {
	vals := make([][]byte, len(keys))
	errs := make([]error, len(keys))
	if err := c.enter(); err != nil {
		fill(errs, err)
		return vals, errs
	}
	defer c.leave()
	start := time.Now()
	defer func() {
		c.stats.batchGetLat.observe(time.Since(start))
		countOps(&c.stats.gets, &c.stats.getFail, len(errs), countErrs(errs))
	}()
	retry := c.batchGetOnce(ctx, keys, into, vals, errs, c.loc != nil && c.locWatch.Fresh())
	if len(retry) == 0 || ctx.Err() != nil {
		return vals, errs
	}
	// Items that failed from cached locations: drop those and ask the
	// master, once.
	rkeys := make([]string, len(retry))
	var rinto [][]byte
	if into != nil {
		rinto = make([][]byte, len(retry))
	}
	for n, i := range retry {
		rkeys[n] = keys[i]
		c.loc.drop(keys[i])
		if into != nil {
			rinto[n] = into[i]
		}
	}
	rvals, rerrs := make([][]byte, len(retry)), make([]error, len(retry))
	c.batchGetOnce(ctx, rkeys, rinto, rvals, rerrs, false)
	for n, i := range retry {
		vals[i], errs[i] = rvals[n], rerrs[n]
	}
	return vals, errs
}

// batchGetOnce fills vals and errs for keys, taking the locations it may
// from the cache when cache is set, and returns the indices of items
// whose cached location failed them.
func (c *Client) batchGetOnce(ctx context.Context, keys []string, into, vals [][]byte, errs []error, cache bool) (retry []int) {
	// Per item, by index: reps is nil for an item not located. One array
	// holds every item's replica order.
	locs := make([]located, len(keys))
	pending := make([]int, 0, len(keys))
	var cached []bool
	// setVal sizes item i's value; false (errs[i] set) when its buffer
	// is short or no replica can hold the size.
	setVal := func(i int, l located) bool {
		size := l.size
		if into == nil {
			if errs[i] = c.readable(ctx, keys[i], l); errs[i] != nil {
				return false
			}
			vals[i] = make([]byte, size)
		} else if uint64(len(into[i])) < size {
			errs[i] = errcode.New(errcode.BufferOverflow, "%q: value of %d bytes, buffer of %d", keys[i], size, len(into[i]))
			return false
		} else {
			vals[i] = into[i][:size]
		}
		return true
	}
	items := make([]int, 0, len(keys))
	okKeys := make([]string, 0, len(keys))
	var epochs []uint64
	var now0 time.Time
	if cache {
		cached = make([]bool, len(keys))
		epochs = make([]uint64, 0, len(keys))
		now0 = c.clock.Now()
	}
	for i, k := range keys {
		if errs[i] = c.checkKey(k); errs[i] != nil {
			continue
		}
		if cache {
			if l, ok := c.cachedLoc(k, now0); ok {
				cached[i] = true
				if setVal(i, l) {
					locs[i] = l
					pending = append(pending, i)
				}
				continue
			}
			c.stats.locMisses.Add(1)
			epochs = append(epochs, c.loc.epoch(k))
		}
		items = append(items, i)
		okKeys = append(okKeys, k)
	}
	if len(items) > 0 {
		t0 := c.clock.Now()
		results, getErrs := c.rpcGetReplicaList(ctx, okKeys)
		refs := make([]replicaRef, 0, len(items))
		for j, i := range items {
			if errs[i] = getErrs[j]; errs[i] != nil {
				continue
			}
			size, reps, err := c.chooseReplicasInto(keys[i], results[j].replicas, refs)
			if err != nil {
				errs[i] = err
				continue
			}
			refs = reps[len(reps):] // the next item appends past this one's
			reps = reps[:len(reps):len(reps)]
			l := located{size: size, reps: reps, deadline: t0.Add(results[j].leaseTTL)}
			if cache {
				c.loc.put(keys[i], l, t0, epochs[j])
			}
			if setVal(i, l) {
				locs[i] = l
				pending = append(pending, i)
			}
		}
	}
	found := len(pending)
	// Attempt k reads every pending item from its k-th replica.
	xs := make([]*xfer, 0, len(pending))
	slots := make([]xfer, len(pending))
	for k := 0; len(pending) > 0 && ctx.Err() == nil; k++ {
		xs = xs[:0]
		for n, i := range pending {
			r := locs[i].reps[k]
			slots[n] = xfer{op: engine.Read, buf: vals[i], seg: r.seg, addr: r.addr, item: i}
			xs = append(xs, &slots[n])
		}
		c.transfer(ctx, xs)
		pending = pending[:0]
		for _, x := range xs {
			if x.err == nil {
				continue
			}
			if k+1 < len(locs[x.item].reps) {
				pending = append(pending, x.item)
			} else {
				errs[x.item] = x.err
			}
		}
	}
	for _, i := range pending { // ctx ended with these unread
		errs[i] = errcode.New(errcode.TransferFail, "%q: %v", keys[i], ctx.Err())
	}
	var now time.Time
	if found > 0 {
		if c.afterRead != nil {
			c.afterRead()
		}
		now = c.clock.Now() // every read has ended: one clock read for all
	}
	for i, l := range locs {
		if l.reps == nil {
			if cached != nil && cached[i] && errs[i] != nil {
				retry = append(retry, i) // a short buffer: the master may know a new size
			}
			continue // not located: its error is set
		}
		if errs[i] == nil {
			errs[i] = c.checkLeaseAt(keys[i], l.deadline, now)
		}
		if errs[i] != nil {
			vals[i] = nil
			if cached != nil && cached[i] {
				retry = append(retry, i)
			}
		}
	}
	return retry
}
