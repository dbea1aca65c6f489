package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/storepb"
)

// xfer moves len(buf) bytes between the caller's buf and [addr,
// addr+len(buf)) of segment seg: a replica write (engine.Write) or read.
type xfer struct {
	op   engine.OpCode
	buf  []byte
	seg  string
	addr uint64
	err  error
	item int // the batch item it belongs to
	// segID is the pool segment of a replica write; segFault that the
	// write failed because of the segment (not of this client or ctx).
	segID    *storepb.UUID
	segFault bool
}

func (x *xfer) fail(err error) {
	if x.err == nil {
		x.err = fmt.Errorf("%w: segment %s: %w", errcode.ErrTransferFail, x.seg, err)
	}
}

// failSeg is fail for an error of the target segment, unless ctx ended
// (then the segment is not to blame).
func (x *xfer) failSeg(ctx context.Context, err error) {
	if x.err == nil && ctx.Err() == nil {
		x.segFault = true
	}
	x.fail(err)
}

// piece is the part of an xfer one engine request carries.
type piece struct {
	x     *xfer
	local []byte // registered memory the request uses: x.buf itself or staging
	user  []byte // the caller's bytes a staged piece stands for
	stage []byte // the staging allocation to free (nil when direct)
	addr  uint64
}

// localSlice returns [addr, addr+n) when it lies in one of this client's
// own segments, which it reads and writes with plain copies.
func (c *Client) localSlice(seg string, addr, n uint64) ([]byte, bool) {
	if seg != c.name {
		return nil, false
	}
	for _, s := range c.segList() {
		if b, ok := s.slice(addr, n); ok {
			return b, true
		}
	}
	return nil, false
}

// transfer performs every xfer, recording failures in x.err: copies for
// this client's own segments, engine requests for the rest, from the
// caller's memory when it is registered and through staging buffers when
// it is not.
func (c *Client) transfer(ctx context.Context, xs []*xfer) {
	remote := xs[:0:0]
	for _, x := range xs {
		if mem, ok := c.localSlice(x.seg, x.addr, uint64(len(x.buf))); ok {
			if x.op == engine.Write {
				copy(mem, x.buf)
				c.stats.written.Add(uint64(len(x.buf)))
			} else {
				copy(x.buf, mem)
				c.stats.read.Add(uint64(len(x.buf)))
			}
			continue
		}
		remote = append(remote, x)
	}
	if len(remote) > 0 {
		c.transferRemote(ctx, remote)
	}
}

func (c *Client) transferRemote(ctx context.Context, xs []*xfer) {
	var idBuf [4]segIDPair
	ids := segIDs(idBuf[:0]) // on the stack for up to 4 segments
	for _, x := range xs {
		if _, ok := ids.get(x.seg); ok {
			continue
		}
		id, err := c.segmentID(ctx, x.seg)
		if err != nil {
			// Every xfer to it fails; mark now, skip below.
			for _, y := range xs {
				if y.seg == x.seg {
					y.failSeg(ctx, err)
				}
			}
			continue
		}
		ids = append(ids, segIDPair{x.seg, id})
	}
	// Rounds: each takes as many pieces as staging room allows (all the
	// direct ones), runs them as one engine batch, then frees its staging.
	// A round waits for staging room only while it holds none, so
	// concurrent calls cannot deadlock on the pool.
	i, off := 0, 0
	sc := xferScratchPool.Get().(*xferScratch)
	defer sc.release()
	round := sc.round[:0] // mostly one piece per xfer
	defer func() { clear(round); sc.round = round[:0] }()
	for {
		clear(round) // the pool keeps no caller's buffer; shorter rounds follow
		round = round[:0]
	fill:
		for i < len(xs) {
			x := xs[i]
			if x.err != nil {
				i, off = i+1, 0
				continue
			}
			if off == 0 && c.regs.contains(x.buf) {
				round = append(round, piece{x: x, local: x.buf, addr: x.addr})
				i++
				continue
			}
			n := min(len(x.buf)-off, c.stage.chunk)
			var st []byte
			if len(round) == 0 {
				var err error
				if st, err = c.stage.alloc(ctx, n); err != nil {
					for _, y := range xs[i:] {
						y.fail(err)
					}
					return
				}
			} else if st = c.stage.tryAlloc(n); st == nil {
				break fill
			}
			user := x.buf[off : off+n]
			if x.op == engine.Write {
				copy(st, user)
				c.stats.staged.Add(uint64(n))
			}
			round = append(round, piece{x: x, local: st, user: user, stage: st, addr: x.addr + uint64(off)})
			if off += n; off == len(x.buf) {
				i, off = i+1, 0
			}
		}
		if len(round) == 0 {
			return
		}
		c.runRound(ctx, round, ids, sc)
		for _, p := range round {
			if p.stage != nil {
				c.stage.free(p.stage)
			}
		}
	}
}

// xferScratch is a transfer's working memory, pooled as roundScratch is.
type xferScratch struct {
	round  []piece
	active []int
	reqs   []engine.Request
}

var xferScratchPool = sync.Pool{New: func() any { return new(xferScratch) }}

// release pools the scratch. Its users clear what they wrote as they
// finish with it, so the pool keeps no caller's buffer.
func (sc *xferScratch) release() {
	if cap(sc.round) > maxPooledItems || cap(sc.reqs) > maxPooledItems {
		return
	}
	xferScratchPool.Put(sc)
}

// segIDs are the segments one transfer opened: a call touches one or a
// few, so a short slice (on the caller's stack) beats a map.
type segIDs []segIDPair

type segIDPair struct {
	name string
	id   engine.SegmentID
}

func (s segIDs) get(name string) (engine.SegmentID, bool) {
	for _, p := range s {
		if p.name == name {
			return p.id, true
		}
	}
	return 0, false
}

// must is get for a segment known to be open.
func (s segIDs) must(name string) engine.SegmentID {
	id, _ := s.get(name)
	return id
}

// runRound submits the pieces as one batch and waits for it.
func (c *Client) runRound(ctx context.Context, round []piece, ids segIDs, sc *xferScratch) {
	bid, err := c.eng.AllocateBatch(len(round))
	if err != nil {
		for _, p := range round {
			p.x.fail(err)
		}
		return
	}
	defer c.freeBatch(bid)
	active := sc.active[:0]
	reqs := sc.reqs[:0]        // Submit copies what it needs of them
	var built []engine.Request // reqs before any refused one is dropped
	defer func() { clear(built); sc.active, sc.reqs = active[:0], reqs[:0] }()
	for k, p := range round {
		if p.x.err != nil {
			continue // an earlier piece of the same xfer failed
		}
		active = append(active, k)
		reqs = append(reqs, engine.Request{Op: p.x.op, Local: p.local, Target: ids.must(p.x.seg), TargetAddr: p.addr})
	}
	built = reqs
	// Submit is all or nothing: drop a refused request and try the rest.
	for len(reqs) > 0 {
		err := c.eng.Submit(bid, reqs)
		if err == nil {
			break
		}
		var re *engine.RequestError
		if !errors.As(err, &re) || re.Index < 0 || re.Index >= len(reqs) {
			for _, k := range active {
				round[k].x.fail(err)
			}
			return
		}
		round[active[re.Index]].x.failSeg(ctx, re.Err)
		active = append(active[:re.Index], active[re.Index+1:]...)
		reqs = append(reqs[:re.Index], reqs[re.Index+1:]...)
	}
	if len(reqs) == 0 {
		return
	}
	_, werr := c.eng.Wait(ctx, bid)
	for j, k := range active {
		p := &round[k]
		ts, err := c.eng.Status(bid, j)
		if err == nil && ts.Status == engine.Completed {
			if p.x.op == engine.Write {
				c.stats.written.Add(uint64(len(p.local)))
			} else {
				if p.stage != nil {
					copy(p.user, p.local)
					c.stats.staged.Add(uint64(len(p.local)))
				}
				c.stats.read.Add(uint64(len(p.local)))
			}
			continue
		}
		switch {
		case err != nil:
		case ts.Err != nil:
			err = ts.Err
		case werr != nil:
			err = werr
		default:
			err = fmt.Errorf("request ended %s", ts.Status)
		}
		p.x.failSeg(ctx, err)
	}
}

// freeBatch frees a batch, waiting for its transports to let go of the
// buffers first (they may still hold them after a cancelled Wait; no
// request outlives the engine's transfer timeout).
func (c *Client) freeBatch(id engine.BatchID) {
	wait := 50 * time.Microsecond
	for {
		err := c.eng.FreeBatch(id)
		if !errors.Is(err, engine.ErrBatchBusy) {
			return
		}
		time.Sleep(wait)
		wait = min(2*wait, 10*time.Millisecond)
	}
}

// segmentID opens a peer segment once and caches the handle.
func (c *Client) segmentID(ctx context.Context, name string) (engine.SegmentID, error) {
	c.segMu.Lock()
	id, ok := c.segIDs[name]
	c.segMu.Unlock()
	if ok {
		return id, nil
	}
	id, err := c.eng.OpenSegment(ctx, name)
	if err != nil {
		return 0, err
	}
	c.segMu.Lock()
	defer c.segMu.Unlock()
	if old, ok := c.segIDs[name]; ok {
		c.eng.CloseSegment(id) // a concurrent opener won; drop our reference
		return old, nil
	}
	c.segIDs[name] = id
	return id, nil
}
