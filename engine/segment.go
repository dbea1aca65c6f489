package engine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
)

// SegmentID is a handle to an opened segment, checked on every use.
type SegmentID uint64

type bufRange struct{ addr, end uint64 }

type segment struct {
	e    *Engine
	id   SegmentID
	name string
	refs int // guarded by segTable.mu

	desc   atomic.Pointer[metadata.SegmentDesc]
	ranges atomic.Pointer[[]bufRange]

	refreshMu   sync.Mutex
	lastRefresh time.Time // when the last fetch ended
	lastErr     error
	closed      atomic.Bool
	stopWatch   context.CancelFunc // nil unless the backend watches; guarded by segTable.mu
}

var _ transport.Peer = (*segment)(nil)

func (s *segment) Name() string                { return s.name }
func (s *segment) Desc() *metadata.SegmentDesc { return s.desc.Load() }

func (s *segment) setDesc(d *metadata.SegmentDesc) {
	rs := make([]bufRange, 0, len(d.Buffers))
	for _, b := range d.Buffers {
		if b.Length == 0 || b.Addr+b.Length < b.Addr {
			continue
		}
		rs = append(rs, bufRange{b.Addr, b.Addr + b.Length})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].addr < rs[j].addr })
	s.desc.Store(d)
	s.ranges.Store(&rs)
}

// covers reports whether the cached descriptor has [addr, addr+n) inside
// one buffer.
func (s *segment) covers(addr, n uint64) bool {
	rs := *s.ranges.Load()
	i := sort.Search(len(rs), func(i int) bool { return rs[i].end > addr })
	return i < len(rs) && addr >= rs[i].addr && rs[i].end-addr >= n
}

// Refresh fetches the descriptor again. Callers that arrive while a fetch
// is running share its result instead of fetching once more.
func (s *segment) Refresh(ctx context.Context) (*metadata.SegmentDesc, error) {
	asked := time.Now()
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	if s.lastRefresh.After(asked) {
		return s.desc.Load(), s.lastErr
	}
	d, err := admit(s.e.backend.Get(ctx, s.name))
	s.lastRefresh, s.lastErr = time.Now(), err
	if err != nil {
		return s.desc.Load(), err
	}
	s.setDesc(d)
	return d, nil
}

// watched applies a descriptor reported by the backend's watch; nil
// means the segment was withdrawn (removed, or its owner's lease
// expired), so nothing of it is offered until it is published again.
func (s *segment) watched(d *metadata.SegmentDesc) {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	if s.closed.Load() {
		return
	}
	if d != nil {
		if err := d.Validate(); err != nil {
			s.e.log.Warn("segment descriptor from the watch is invalid; ignored", "segment", s.name, "err", err)
			return
		}
	}
	if d == nil {
		s.setDesc(&metadata.SegmentDesc{Name: s.name})
		s.lastErr = fmt.Errorf("%w: %q was withdrawn", ErrSegmentNotFound, s.name)
		s.e.log.Debug("segment withdrawn (watch)", "segment", s.name)
	} else {
		s.setDesc(d)
		s.lastErr = nil
		s.e.log.Debug("segment descriptor changed (watch)", "segment", s.name, "buffers", len(d.Buffers))
	}
	s.lastRefresh = time.Now()
}

// admit checks what a backend returned before any transport sees it:
// the built-in backends decode with metadata.UnmarshalDesc, which
// validates, but a registered backend may return any descriptor.
func admit(d *metadata.SegmentDesc, err error) (*metadata.SegmentDesc, error) {
	if err != nil {
		return nil, err
	}
	if d == nil {
		return nil, fmt.Errorf("%w: backend returned none", metadata.ErrBadDescriptor)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

// watchSegment follows s's descriptor when the backend can report
// changes; the watch ends when the segment's last reference closes or the
// engine closes. Called with segTable.mu held.
func (e *Engine) watchSegment(s *segment) {
	w, ok := e.backend.(metadata.Watcher)
	if !ok {
		return
	}
	ctx, cancel := context.WithCancel(e.watchCtx)
	s.stopWatch = cancel
	if !e.bg.Go(func() {
		if err := w.Watch(ctx, s.name, s.watched); err != nil && ctx.Err() == nil {
			e.log.Warn("segment watch ended", "segment", s.name, "err", err)
		}
	}) {
		cancel()
	}
}

// segTable holds opened segments by handle and by name.
type segTable struct {
	handles[segment] // mu also guards byName and refs
	byName           map[string]*segment
}

// OpenSegment resolves a segment by name (for P2P handshake, the peer's
// "host:port") and returns a handle. Opening the same name again returns
// the same handle and counts one more reference.
func (e *Engine) OpenSegment(ctx context.Context, name string) (SegmentID, error) {
	if e.closed.Load() {
		return 0, ErrClosed
	}
	e.segs.mu.Lock()
	if s, ok := e.segs.byName[name]; ok {
		s.refs++
		e.segs.mu.Unlock()
		return s.id, nil
	}
	e.segs.mu.Unlock()

	d, err := admit(e.backend.Get(ctx, name))
	if err != nil {
		return 0, fmt.Errorf("%w: %q: %w", ErrSegmentNotFound, name, err)
	}
	s := &segment{e: e, name: name, refs: 1}
	s.setDesc(d)

	e.segs.mu.Lock()
	defer e.segs.mu.Unlock()
	if e.closed.Load() {
		return 0, ErrClosed
	}
	if old, ok := e.segs.byName[name]; ok { // lost a race with another opener
		old.refs++
		return old.id, nil
	}
	s.id = SegmentID(e.segs.addLocked(s))
	e.segs.byName[name] = s
	e.watchSegment(s)
	return s.id, nil
}

// CloseSegment drops one reference to a segment; the last one releases
// the connections kept for it, and requests still running on them end
// FAILED.
func (e *Engine) CloseSegment(id SegmentID) error {
	e.segs.mu.Lock()
	s, ok := e.segs.getLocked(uint64(id))
	if !ok {
		e.segs.mu.Unlock()
		return fmt.Errorf("%w: %#x", ErrInvalidSegment, uint64(id))
	}
	s.refs--
	last := s.refs == 0
	if last {
		e.segs.removeLocked(uint64(id))
		delete(e.segs.byName, s.name)
		s.closed.Store(true)
		if s.stopWatch != nil {
			s.stopWatch()
		}
	}
	e.segs.mu.Unlock()
	if last {
		for _, t := range e.transportsNow() {
			t.ClosePeer(s.name)
		}
	}
	return nil
}

// SegmentDesc returns the cached descriptor of an opened segment.
func (e *Engine) SegmentDesc(id SegmentID) (*metadata.SegmentDesc, error) {
	s, err := e.segment(id)
	if err != nil {
		return nil, err
	}
	return s.Desc(), nil
}

// RefreshSegment fetches the descriptor of an opened segment again.
func (e *Engine) RefreshSegment(ctx context.Context, id SegmentID) error {
	s, err := e.segment(id)
	if err != nil {
		return err
	}
	s.refreshMu.Lock()
	s.lastRefresh = time.Time{}
	s.refreshMu.Unlock()
	_, err = s.Refresh(ctx)
	return err
}

// RefreshSegments fetches the descriptor of every opened segment again
// (the reference's syncSegmentCache); the error joins those that failed.
func (e *Engine) RefreshSegments(ctx context.Context) error {
	if e.closed.Load() {
		return ErrClosed
	}
	e.segs.mu.RLock()
	ids := make([]SegmentID, 0, len(e.segs.byName))
	for _, s := range e.segs.byName {
		ids = append(ids, s.id)
	}
	e.segs.mu.RUnlock()
	var errs []error
	for _, id := range ids {
		if err := e.RefreshSegment(ctx, id); err != nil && !errors.Is(err, ErrInvalidSegment) { // closed meanwhile
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (e *Engine) segment(id SegmentID) (*segment, error) {
	s, ok := e.segs.get(uint64(id))
	if !ok {
		return nil, fmt.Errorf("%w: %#x", ErrInvalidSegment, uint64(id))
	}
	return s, nil
}

// CheckRange returns nil when [addr, addr+n) lies in a registered buffer
// of segment id, fetching the descriptor once more when the cached one
// does not hold it, and ErrOutOfBounds when it does not: a reader given
// a range by a third party (the store's master) checks it before it
// allocates a buffer that size.
func (e *Engine) CheckRange(ctx context.Context, id SegmentID, addr, n uint64) error {
	s, err := e.segment(id)
	if err != nil {
		return err
	}
	if s.covers(addr, n) {
		return nil
	}
	if _, err := s.Refresh(ctx); err != nil {
		return fmt.Errorf("%w: [%#x,%#x) of %s (refresh failed: %v)", ErrOutOfBounds, addr, addr+n, s.name, err)
	}
	if !s.covers(addr, n) {
		return fmt.Errorf("%w: [%#x,%#x) of %s", ErrOutOfBounds, addr, addr+n, s.name)
	}
	return nil
}

// routeRequest checks the target range against the segment's buffers and
// picks the first transport that accepts it. When the cached descriptor
// does not hold the range, or no transport takes it (a same-host peer
// withdrew the buffer), the descriptor is fetched once more first.
func (e *Engine) routeRequest(s *segment, addr, n uint64) (transport.Transport, error) {
	var refreshErr error
	var tried []transport.Transport
	for attempt := 0; ; attempt++ {
		if s.covers(addr, n) {
			tried = e.transportsNow()
			for _, t := range tried {
				if t.Accepts(s, addr, n) {
					return t, nil
				}
			}
		}
		if attempt == 1 {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.MetadataTimeout)
		_, refreshErr = s.Refresh(ctx)
		cancel()
	}
	if !s.covers(addr, n) {
		if refreshErr != nil {
			return nil, fmt.Errorf("%w: [%#x,%#x) of %s (refresh failed: %v)", ErrOutOfBounds, addr, addr+n, s.name, refreshErr)
		}
		return nil, fmt.Errorf("%w: [%#x,%#x) of %s", ErrOutOfBounds, addr, addr+n, s.name)
	}
	return nil, e.noTransport(s, tried)
}
