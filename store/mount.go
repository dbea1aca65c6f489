package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// segList is the mounted segments (never modified in place).
func (c *Client) segList() []*segment {
	if p := c.segs.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *Client) setSegs(s []*segment) { c.segs.Store(&s) }

// Mount contributes size more bytes of memory to the pool, as one more
// segment (memfd memory registered with the engine and mounted on the
// master), and starts the heartbeat if it is the first. A client made
// with GlobalSegmentSize 0 sends no heartbeat until it mounts one.
func (c *Client) Mount(ctx context.Context, size int64) (SegmentInfo, error) {
	if err := c.enter(); err != nil {
		return SegmentInfo{}, err
	}
	defer c.leave()
	if size <= 0 {
		return SegmentInfo{}, errcode.New(errcode.InvalidParams, "mount a segment of %d bytes", size)
	}
	return c.mountNew(ctx, size)
}

// mountNew sets size bytes aside, mounts them and starts the heartbeat.
func (c *Client) mountNew(ctx context.Context, size int64) (SegmentInfo, error) {
	c.mountMu.Lock()
	defer c.mountMu.Unlock()
	seg, err := c.newSegment(size)
	if err != nil {
		return SegmentInfo{}, err
	}
	rctx, cancel := c.rpcCtx(ctx)
	_, err = c.master.MountSegment(rctx, &storepb.MountSegmentRequest{ClientId: c.id.pb(), Session: c.session, Segment: seg.pb()})
	cancel()
	if err != nil {
		uctx, cancel := context.WithTimeout(context.Background(), c.cfg.RPCTimeout)
		c.eng.UnregisterMemory(uctx, seg.mem)
		cancel()
		seg.pool.Close()
		return SegmentInfo{}, fmt.Errorf("store: mount segment: %w", rpcerr.FromStatus(err))
	}
	seg.mounted = true
	c.regs.add(seg.mem)
	c.setSegs(append(slices.Clip(c.segList()), seg))
	c.startHeartbeat()
	return seg.info, nil
}

// Unmount withdraws a segment given by Mount (or New) from the master and
// the engine; the heartbeat stops with the last one. Objects with
// replicas there lose them. Its memory is unmapped once the calls in
// progress have returned (Unmount waits for them, holding new calls
// back meanwhile) and no Buffer views the client's memory (the last
// Release, else Close).
func (c *Client) Unmount(ctx context.Context, id UUID) error {
	removed, err := c.unmount(ctx, id)
	if removed {
		c.freeRetired()
	}
	return err
}

func (c *Client) unmount(ctx context.Context, id UUID) (removed bool, _ error) {
	if err := c.enter(); err != nil {
		return false, err
	}
	defer c.leave()
	c.mountMu.Lock()
	segs := c.segList()
	i := slices.IndexFunc(segs, func(s *segment) bool { return s.info.ID == id })
	if i < 0 {
		c.mountMu.Unlock()
		return false, errcode.New(errcode.SegmentNotFound, "segment %s is not mounted by this client", id)
	}
	seg := segs[i]
	rest := slices.Delete(slices.Clone(segs), i, i+1)
	c.setSegs(rest)
	c.retired = append(c.retired, seg)
	rctx, cancel := c.rpcCtx(ctx)
	_, err := c.master.UnmountSegment(rctx, &storepb.UnmountSegmentRequest{ClientId: c.id.pb(), Session: c.session, SegmentId: seg.info.ID.pb()})
	cancel()
	c.mountMu.Unlock()
	if len(rest) == 0 {
		// Outside mountMu: a beat may be waiting for it in remount.
		c.stopHeartbeatIfIdle()
	}
	if c.ahead != nil {
		c.ahead.dropOn([]*storepb.UUID{seg.info.ID.pb()})
	}
	c.regs.remove(seg.mem)
	uctx, ucancel := context.WithTimeout(context.Background(), c.cfg.RPCTimeout)
	uerr := c.eng.UnregisterMemory(uctx, seg.mem)
	ucancel()
	if uerr != nil && !errors.Is(uerr, engine.ErrClosed) {
		uerr = fmt.Errorf("store: unregister segment: %w", uerr)
	} else {
		uerr = nil
	}
	if err != nil && !errors.Is(rpcerr.FromStatus(err), errcode.ErrSegmentNotFound) {
		return true, errors.Join(fmt.Errorf("store: unmount segment %s: %w", id, rpcerr.FromStatus(err)), uerr)
	}
	return true, uerr
}

// freeRetired unmaps unmounted segments once nothing can touch them: no
// call that may have seen them is still running (the exclusive lock
// waits for those), and no Buffer holds a view (else the last Release
// unmaps them).
func (c *Client) freeRetired() {
	c.life.Lock()
	defer c.life.Unlock()
	if c.closed.Load() {
		return // teardown unmaps them
	}
	c.mountMu.Lock()
	c.drained = append(c.drained, c.retired...)
	c.retired = nil
	c.mountMu.Unlock()
	c.bufMu.Lock()
	idle := c.views == 0
	c.bufMu.Unlock()
	if idle {
		c.unmapDrained()
	}
}

// unmapDrained unmaps the segments freeRetired found unreachable.
func (c *Client) unmapDrained() {
	c.mountMu.Lock()
	d := c.drained
	c.drained = nil
	c.mountMu.Unlock()
	for _, s := range d {
		s.pool.Close()
	}
}

// newSegment sets aside size bytes of memfd memory, registered with the
// engine, to contribute as one segment.
func (c *Client) newSegment(size int64) (*segment, error) {
	pool, err := newArena("crescent-segment", size, 0, c.cfg.AllowOvercommit)
	if err != nil {
		return nil, fmt.Errorf("store: segment memory: %w", err)
	}
	mem := pool.Bytes()[:size:size]
	if err := c.eng.RegisterMemory(mem, "*"); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: register segment: %w", err)
	}
	return &segment{pool: pool, mem: mem, info: SegmentInfo{
		ID: newUUID(), Name: c.name, Base: spanOf(mem).addr, Size: uint64(size), Protocol: c.eng.LocalDesc().Protocol,
	}}, nil
}

// startHeartbeat starts the heartbeat loop unless it runs.
func (c *Client) startHeartbeat() {
	c.hbMu.Lock()
	defer c.hbMu.Unlock()
	if c.hbStop != nil {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	c.hbStop, c.hbDone = stop, make(chan struct{})
	go c.heartbeatLoop(ctx, c.hbDone)
}

// stopHeartbeat stops the heartbeat loop and waits for it to exit.
func (c *Client) stopHeartbeat() {
	c.hbMu.Lock()
	stop, done := c.hbStop, c.hbDone
	c.hbStop, c.hbDone = nil, nil
	c.hbMu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// stopHeartbeatIfIdle stops the heartbeat when no segment is mounted (a
// Mount may have raced the Unmount that asked).
func (c *Client) stopHeartbeatIfIdle() {
	c.hbMu.Lock()
	if len(c.segList()) > 0 || c.hbStop == nil {
		c.hbMu.Unlock()
		return
	}
	stop, done := c.hbStop, c.hbDone
	c.hbStop, c.hbDone = nil, nil
	c.hbMu.Unlock()
	stop()
	<-done
}

// heartbeating reports whether the heartbeat loop runs.
func (c *Client) heartbeating() bool {
	c.hbMu.Lock()
	defer c.hbMu.Unlock()
	return c.hbStop != nil
}

// beatNow makes the heartbeat (if it runs) beat at once.
func (c *Client) beatNow() {
	select {
	case c.hbNow <- struct{}{}:
	default:
	}
}
