package local

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

// encRC and decRC carry a ReplicateConfig (block metadata is not
// forwarded).
func encRC(e *enc, rc store.ReplicateConfig) {
	e.u32(uint32(rc.Replicas))
	e.u32(uint32(rc.MinReplicas))
	e.bool(rc.SoftPin)
	e.u64(uint64(rc.SoftPinTTL))
	e.bool(rc.HardPin)
	e.bool(rc.SameNode)
	e.u32(uint32(len(rc.Preferred)))
	for _, p := range rc.Preferred {
		e.str(p)
	}
}

func decRC(d *dec) store.ReplicateConfig {
	var rc store.ReplicateConfig
	rc.Replicas = int(d.u32())
	rc.MinReplicas = int(d.u32())
	rc.SoftPin = d.bool()
	rc.SoftPinTTL = time.Duration(min(d.u64(), 1<<62))
	rc.HardPin = d.bool()
	rc.SameNode = d.bool()
	n := d.count()
	for range n {
		rc.Preferred = append(rc.Preferred, d.str())
	}
	return rc
}

// serve runs one request (in its own goroutine).
func (ss *session) serve(op byte, body []byte) result {
	ctx, cancel := ss.ctx()
	defer cancel()
	d := dec{b: body}
	s := ss.s
	e := newEnc(op, 0, token{})
	switch op {
	case opUnregister:
		return ss.unregister(body)
	case opPut:
		key := d.str()
		v, put, err := ss.value(&d)
		if err != nil {
			return result{err: err}
		}
		defer put()
		rc := decRC(&d)
		if err := d.done(); err != nil {
			return result{err: err}
		}
		return result{err: s.put(ctx, key, v, rc)}
	case opBatchPut:
		n := d.count()
		keys, vals := make([]string, n), make([][]byte, n)
		for i := range n {
			keys[i] = d.str()
			v, put, err := ss.value(&d)
			if err != nil {
				return result{err: err}
			}
			defer put()
			vals[i] = v
		}
		rc := decRC(&d)
		if err := d.done(); err != nil {
			return result{err: err}
		}
		for _, k := range keys {
			s.invalidate(k)
		}
		errs := s.c.BatchPut(ctx, keys, vals, rc)
		for _, k := range keys {
			s.invalidate(k)
		}
		encErrs(e, errs)
		return result{e: e}
	case opGet:
		key := d.str()
		var dst []byte
		inline := d.u8() == refNone
		if !inline {
			b, put, err := ss.span(&d)
			if err != nil {
				return result{err: err}
			}
			defer put()
			dst = b
		}
		if err := d.done(); err != nil {
			return result{err: err}
		}
		v, n, err := s.get(ctx, key, dst, inline)
		if err != nil {
			return result{err: err}
		}
		e.u64(uint64(n))
		if inline {
			e.bytes(v)
		}
		return result{e: e}
	case opBatchGet:
		n := d.count()
		type item struct {
			key    string
			dst    []byte
			inline bool
		}
		items := make([]item, n)
		for i := range n {
			items[i].key = d.str()
			if items[i].inline = d.u8() == refNone; !items[i].inline {
				b, put, err := ss.span(&d)
				if err != nil {
					return result{err: err}
				}
				defer put()
				items[i].dst = b
			}
		}
		if err := d.done(); err != nil {
			return result{err: err}
		}
		e.u32(uint32(n))
		total := 0
		for _, it := range items {
			v, m, err := s.get(ctx, it.key, it.dst, it.inline)
			if err == nil && it.inline && total+len(v) > MaxInline {
				err = errcode.New(errcode.BufferOverflow, "%q: batch reply over %d bytes; read it alone or into a registered buffer", it.key, MaxInline)
			}
			encItemErr(e, err)
			if err != nil {
				continue
			}
			e.u64(uint64(m))
			if it.inline {
				total += len(v)
				e.bytes(v)
			}
		}
		return result{e: e}
	case opGetBuffer, opBatchGetBuffer:
		keys := []string{}
		if op == opGetBuffer {
			keys = append(keys, d.str())
		} else {
			n := d.count()
			for range n {
				keys = append(keys, d.str())
			}
		}
		if err := d.done(); err != nil {
			return result{err: err}
		}
		if op == opBatchGetBuffer {
			e.u32(uint32(len(keys)))
		}
		total := 0
		for _, k := range keys {
			err := ss.getBuffer(ctx, e, k, &total)
			if op == opGetBuffer && err != nil {
				return result{err: err}
			}
			if op == opBatchGetBuffer && err != nil {
				encItemErr(e, err)
			}
		}
		return result{e: e}
	case opExist:
		key := d.str()
		if err := d.done(); err != nil {
			return result{err: err}
		}
		ok, err := s.c.IsExist(ctx, key)
		if err != nil {
			return result{err: err}
		}
		e.bool(ok)
		return result{e: e}
	case opBatchExist:
		keys := decKeys(&d)
		if err := d.done(); err != nil {
			return result{err: err}
		}
		oks, errs := s.c.BatchIsExist(ctx, keys)
		e.u32(uint32(len(keys)))
		for i := range keys {
			encItemErr(e, errs[i])
			if errs[i] == nil {
				e.bool(oks[i])
			}
		}
		return result{e: e}
	case opRemove:
		key := d.str()
		force := d.bool()
		if err := d.done(); err != nil {
			return result{err: err}
		}
		s.invalidate(key)
		err := s.c.Remove(ctx, key, force)
		s.invalidate(key)
		return result{err: err}
	case opBatchRemove:
		keys := decKeys(&d)
		force := d.bool()
		if err := d.done(); err != nil {
			return result{err: err}
		}
		for _, k := range keys {
			s.invalidate(k)
		}
		errs := s.c.BatchRemove(ctx, keys, force)
		for _, k := range keys {
			s.invalidate(k)
		}
		encErrs(e, errs)
		return result{e: e}
	}
	return result{err: fmt.Errorf("%w: operation %d", ErrProtocol, op)}
}

func decKeys(d *dec) []string {
	n := d.count()
	keys := make([]string, 0, n)
	for range n {
		keys = append(keys, d.str())
	}
	return keys
}

func encErrs(e *enc, errs []error) {
	e.u32(uint32(len(errs)))
	for _, err := range errs {
		encItemErr(e, err)
	}
}

// encItemErr is a batch item's status: code 0, or code and message.
func encItemErr(e *enc, err error) {
	if err == nil {
		e.i32(0)
		return
	}
	e.err(err)
}

func (d *dec) itemErr() error {
	c := errcode.Code(d.i32())
	if c == errcode.OK {
		return nil
	}
	msg := d.str()
	if d.err != nil {
		return d.err
	}
	return errcode.FromCode(c, msg)
}

// invalidate withdraws key from the cache (before and after each write
// or remove: a fill that started in between must not publish the old
// bytes).
func (s *Server) invalidate(key string) {
	if s.hot != nil {
		s.hot.invalidate(key)
	}
}

func (s *Server) put(ctx context.Context, key string, v []byte, rc store.ReplicateConfig) error {
	s.invalidate(key)
	err := s.c.PutFrom(ctx, key, v, rc)
	s.invalidate(key)
	return err
}

// lookup returns key's cached block with a reference when it may be
// served: within the lease the fill (or the last check) obtained, or
// after asking the master again that the replica is still the one the
// bytes came from. A stale block is withdrawn.
func (s *Server) lookup(ctx context.Context, key string) *block {
	if s.hot == nil {
		return nil
	}
	if !s.watch.Fresh() {
		// Invalidations may be missed: serve nothing cached.
		s.hot.misses.Add(1)
		s.st.staleMisses.Add(1)
		return nil
	}
	b := s.hot.acquire(key)
	if b == nil {
		s.hot.misses.Add(1)
		return nil
	}
	s.hot.mu.Lock()
	loc := b.loc
	s.hot.mu.Unlock()
	if !leaseValid(loc.Deadline, time.Now(), leaseMargin) {
		now, err := s.c.Locate(ctx, key)
		if err != nil || !sameReplica(loc, now) || !s.hot.renew(b, now) {
			s.hot.release(b)
			if err == nil || errors.Is(err, errcode.ErrObjectNotFound) {
				s.hot.invalidate(key)
			}
			s.hot.misses.Add(1)
			return nil
		}
	}
	s.hot.hits.Add(1)
	return b
}

// get serves Get and GetInto: into dst (a registered span) or, inline,
// into a new slice returned.
func (s *Server) get(ctx context.Context, key string, dst []byte, inline bool) ([]byte, int, error) {
	if b := s.lookup(ctx, key); b != nil {
		defer s.hot.release(b)
		v := b.bytes()
		s.st.hitBytes.Add(uint64(len(v)))
		if inline {
			return append([]byte(nil), v...), len(v), nil
		}
		if len(dst) < len(v) {
			return nil, 0, errcode.New(errcode.BufferOverflow, "%q: value of %d bytes, buffer of %d", key, len(v), len(dst))
		}
		return nil, copy(dst, v), nil
	}
	var tok uint64
	if s.hot != nil && s.hot.admit(key) {
		tok = s.hot.startFill(key) // before the read: an overwrite meanwhile withdraws it
	}
	var v []byte
	var n int
	var err error
	if inline {
		v, err = s.c.Get(ctx, key)
		n = len(v)
	} else {
		n, err = s.c.GetInto(ctx, key, dst)
	}
	if tok != 0 {
		if err != nil || n > s.hot.blockSize {
			s.hot.cancelFill(key, tok)
		} else {
			select {
			case s.fillq <- fillTask{key, tok}:
			default:
				s.hot.cancelFill(key, tok)
				s.st.fillDropped.Add(1)
			}
		}
	}
	return v, n, err
}

// fillLoop fills the cache with values that were admitted on a miss,
// reading them again into a block, off the request's path.
func (s *Server) fillLoop() {
	defer s.fillWG.Done()
	for {
		select {
		case <-s.fillStop:
			return
		case t := <-s.fillq:
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if b, _ := s.fill(ctx, t.key, t.tok); b != nil {
				s.hot.release(b)
			}
			cancel()
		}
	}
}

// fill reads key into a free block and publishes it under tok. It
// returns the block with a reference (published or not), or nil and the
// reason.
func (s *Server) fill(ctx context.Context, key string, tok uint64) (*block, error) {
	loc, err := s.c.Locate(ctx, key)
	if err != nil {
		s.hot.cancelFill(key, tok)
		return nil, err
	}
	if loc.Size > uint64(s.hot.blockSize) {
		s.hot.cancelFill(key, tok)
		return nil, errTooBig
	}
	if !s.opts.Shm && len(loc.Replicas) > 0 && loc.Replicas[0].Segment == s.c.SegmentName() {
		s.hot.cancelFill(key, tok) // a private cache gains nothing on a local replica
		return nil, errLocal
	}
	b := s.hot.take()
	if b == nil {
		s.hot.cancelFill(key, tok)
		return nil, errNoBlock
	}
	if err := s.c.ReadAt(ctx, key, loc, b.mem); err != nil {
		s.hot.cancelFill(key, tok)
		s.hot.release(b)
		return nil, err
	}
	b.n = int(loc.Size)
	if s.hot.beforePublish != nil {
		s.hot.beforePublish(key)
	}
	s.hot.publish(key, tok, b, int(loc.Size), loc)
	return b, nil
}

var (
	errTooBig  = errors.New("local: value larger than a cache block")
	errNoBlock = errors.New("local: every cache block is held")
	errLocal   = errors.New("local: replica in the real client's own segment")
	errShare   = errors.New("local: the dummy holds views of its share of the cache blocks")
)

// encInline answers a GetBuffer item with the bytes themselves, within
// the reply's MaxInline.
func encInline(e *enc, key string, v []byte, total *int) error {
	if *total+len(v) > MaxInline {
		return errcode.New(errcode.BufferOverflow, "%q: reply over %d bytes", key, MaxInline)
	}
	*total += len(v)
	encItemErr(e, nil)
	e.u8(refNone)
	e.bytes(v)
	e.u64(0)
	return nil
}

// getBuffer answers one GetBuffer: a view of a shared cache block when
// the cache is shared, else the bytes inline.
func (ss *session) getBuffer(ctx context.Context, e *enc, key string, total *int) error {
	s := ss.s
	if s.hot == nil || !s.opts.Shm {
		v, _, err := s.get(ctx, key, nil, true)
		if err != nil {
			return err
		}
		return encInline(e, key, v, total)
	}
	b := s.lookup(ctx, key)
	if b == nil {
		// Read straight into a block: published when admitted, else a
		// transient view freed at release.
		var tok uint64
		if s.hot.admit(key) {
			tok = s.hot.startFill(key)
		}
		var err error
		b, err = s.fill(ctx, key, tok)
		switch {
		case errors.Is(err, errTooBig) || errors.Is(err, errNoBlock):
			v, gerr := s.c.Get(ctx, key)
			if gerr != nil {
				return gerr
			}
			return encInline(e, key, v, total)
		case err != nil:
			return err
		}
	} else {
		s.st.hitBytes.Add(uint64(b.n))
	}
	hd, err := ss.hold(b, s.blockShare())
	if errors.Is(err, errShare) {
		// Past its share: a copy, and the block stays free for others.
		v := append([]byte(nil), b.bytes()...)
		s.hot.release(b)
		s.st.shareCopies.Add(1)
		return encInline(e, key, v, total)
	}
	if err != nil {
		s.hot.release(b)
		return err
	}
	s.hot.mu.Lock()
	deadline := b.loc.Deadline
	s.hot.mu.Unlock()
	encItemErr(e, nil)
	e.u8(refShm)
	e.u64(hd)
	e.u64(uint64(b.off))
	e.u64(uint64(b.n))
	e.u64(uint64(deadline.UnixNano()))
	return nil
}
