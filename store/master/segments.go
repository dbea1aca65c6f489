package master

import (
	"slices"
	"strings"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// MountSegment adds memory a client contributes to the pool and starts
// tracking the client's liveness (it must Ping within ClientTTL from
// now on). s.Client is set to client. A known segment ID, or a range
// that overlaps a mounted segment of the same engine segment name
// (whichever client mounted it), is ErrSegmentAlreadyExists; bad geometry
// ErrInvalidParams.
func (m *Master) MountSegment(client UUID, s alloc.Segment) error {
	if client.IsZero() {
		return errcode.New(errcode.InvalidParams, "client id is zero")
	}
	s.Client = client
	m.segMu.Lock()
	defer m.segMu.Unlock()
	if _, ok := m.alloc.Lookup(s.ID); !ok {
		if err := m.mountRoom(client); err != nil {
			return err
		}
	}
	return m.mountLocked(s)
}

// mountRoom reports NO_AVAILABLE_HANDLE when client may not mount one
// more segment (Config.MaxSegments, MaxSegmentsPerClient); segMu is
// held.
func (m *Master) mountRoom(client UUID) error {
	total, own := m.alloc.Counts(client)
	switch {
	case own >= m.cfg.MaxSegmentsPerClient:
		return errcode.New(errcode.NoAvailableHandle, "client %v has %d segments mounted, at most %d", client, own, m.cfg.MaxSegmentsPerClient)
	case total >= m.cfg.MaxSegments:
		return errcode.New(errcode.NoAvailableHandle, "the master has %d segments mounted, at most %d", total, m.cfg.MaxSegments)
	}
	return nil
}

func (m *Master) mountLocked(s alloc.Segment) error {
	if err := m.apply(nil, 0, &Op{Kind: OpMount, Time: m.now(), Client: s.Client, Segment: &s}, &applyArgs{}); err != nil {
		return err
	}
	m.cfg.Logger.Info("master: segment mounted", "segment", s.ID.String(), "name", s.Name, "client", s.Client.String(),
		"size", s.Size, "protocol", s.Protocol)
	return nil
}

// ReMountSegment mounts a client's segments again after NEED_REMOUNT.
// Segments the master still has for this client are kept as they are
// (a remount is idempotent); a segment ID mounted by another client, or a
// new segment overlapping a mounted one as in MountSegment, is
// ErrSegmentAlreadyExists.
// The client is tracked again (a pure client with no segments is not).
func (m *Master) ReMountSegment(client UUID, segs []alloc.Segment) error {
	if client.IsZero() {
		return errcode.New(errcode.InvalidParams, "client id is zero")
	}
	m.segMu.Lock()
	defer m.segMu.Unlock()
	for _, s := range segs {
		s.Client = client
		if idx, ok := m.alloc.Lookup(s.ID); ok {
			old, _ := m.alloc.Segment(idx)
			if old.Client != client {
				return errcode.New(errcode.SegmentAlreadyExists, "segment %v belongs to client %v", s.ID, old.Client)
			}
			continue
		}
		if err := m.mountRoom(client); err != nil {
			return err
		}
		if err := m.mountLocked(s); err != nil {
			return err
		}
	}
	if len(segs) > 0 {
		m.touch(client)
	}
	return nil
}

// touch marks a tracked client as seen now.
func (m *Master) touch(client UUID) {
	m.clientMu.RLock()
	if c := m.clients[client]; c != nil {
		c.lastSeen.Store(m.now())
	}
	m.clientMu.RUnlock()
}

// UnmountSegment removes a client's segment: placement on it stops, its
// replicas are dropped, objects left with none are erased (EventRemoved,
// ReasonLost), then it is released. An unknown ID is
// ErrSegmentNotFound; another client's segment ErrIllegalClient.
func (m *Master) UnmountSegment(client UUID, id UUID) error {
	m.segMu.Lock()
	defer m.segMu.Unlock()
	idx, ok := m.alloc.Lookup(id)
	if !ok {
		return errcode.New(errcode.SegmentNotFound, "segment %v", id)
	}
	s, _ := m.alloc.Segment(idx)
	if s.Client != client {
		return errcode.New(errcode.IllegalClient, "segment %v belongs to another client", id)
	}
	if err := m.unmountLocked(s, true); err != nil {
		return err
	}
	m.cfg.Logger.Info("master: segment unmounted", "segment", id.String(), "name", s.Name, "client", client.String(), "size", s.Size)
	if len(m.alloc.ByClient(client)) > 0 {
		return nil
	}
	// Its last segment: the client left (it is not an expiry, nor active).
	m.clientMu.RLock()
	_, tracked := m.clients[client]
	m.clientMu.RUnlock()
	if !tracked {
		return nil
	}
	m.departedClients.Add(1)
	m.cfg.Logger.Info("master: client unmounted its last segment; forgetting it", "client", client.String())
	return m.apply(nil, 0, &Op{Kind: OpClientLeft, Time: m.now(), Client: client}, &applyArgs{})
}

// unmountLocked runs the unmount sequence; segMu is held. clean says it
// is the client's own UnmountSegment, not an expiry.
func (m *Master) unmountLocked(s alloc.Segment, clean bool) error {
	start := &Op{Kind: OpUnmountStart, Time: m.now(), Client: s.Client, Segment: &s}
	if err := m.apply(nil, 0, start, &applyArgs{}); err != nil {
		return err
	}
	idx := start.Segments[0]
	// Reservations first: a Commit moves a reservation's replicas into a
	// key, so one landing after the shard walk passed its key's shard
	// would keep a replica on the released segment. Once they are dropped
	// nothing can place on it (UnmountStart stops placement), and the walk
	// catches every key committed before.
	if err := m.dropReserved(idx, clean); err != nil {
		return err
	}
	if m.unmountHook != nil {
		m.unmountHook()
	}
	// Walk only if something may still point at the segment.
	if st, ok := m.alloc.Stat(idx); ok && st.Allocs > 0 {
		for i := range m.shards {
			sh := &m.shards[i]
			sh.mu.Lock()
			now := m.now()
			var err error
			sh.each(func(k string, o *object) bool {
				if o.r0.Seg == idx || o.ext != nil && slices.ContainsFunc(o.ext.more, func(p alloc.Placement) bool { return p.Seg == idx }) {
					err = m.apply(sh, m.hash(k), &Op{Kind: OpDropReplica, Time: now, Key: strings.Clone(k), Segments: []uint32{idx}}, &applyArgs{unmount: clean})
				}
				return err == nil
			})
			if err != nil {
				sh.unlock()
				m.flushEvents()
				return err
			}
			sh.unlock()
			m.flushEvents()
		}
	}
	return m.apply(nil, 0, &Op{Kind: OpUnmount, Time: m.now(), Client: s.Client, Segments: []uint32{idx}}, &applyArgs{})
}

// QuerySegmentStatus describes the segment with this ID
// (ErrSegmentNotFound if none).
func (m *Master) QuerySegmentStatus(id UUID) (SegmentInfo, error) {
	idx, ok := m.alloc.Lookup(id)
	if !ok {
		return SegmentInfo{}, errcode.New(errcode.SegmentNotFound, "segment %v", id)
	}
	st, ok := m.alloc.Stat(idx)
	if !ok {
		return SegmentInfo{}, errcode.New(errcode.SegmentNotFound, "segment %v", id)
	}
	return segInfo(st), nil
}

func segInfo(st alloc.SegmentStats) SegmentInfo {
	status := SegmentOK
	if st.Unmounting {
		status = SegmentUnmounting
	}
	return SegmentInfo{Segment: st.Segment, Index: st.Index, Status: status, Capacity: st.Capacity,
		Used: st.Used, Allocs: st.Allocs, LargestFree: st.LargestFree, Suspect: st.Suspect}
}

// Ping records a heartbeat. A client the master does not track (never
// mounted, expired, or mounted on another master) gets NEED_REMOUNT.
// The view version is constant for the master's lifetime.
func (m *Master) Ping(client UUID) (uint64, ClientStatus) {
	m.clientMu.RLock()
	c := m.clients[client]
	m.clientMu.RUnlock()
	if c == nil || c.expiring.Load() {
		return m.view, ClientNeedRemount
	}
	c.lastSeen.Store(m.now())
	m.clearSuspect(client)
	return m.view, ClientOK
}

// expireClients unmounts the segments of clients silent for longer than
// ClientTTL and forgets them.
func (m *Master) expireClients(now int64) {
	m.segMu.Lock()
	defer m.segMu.Unlock()
	var dead []UUID
	m.clientMu.RLock()
	for id, c := range m.clients {
		if now-c.lastSeen.Load() > int64(m.cfg.ClientTTL) {
			c.expiring.Store(true) // Pings get NEED_REMOUNT from here on
			dead = append(dead, id)
		}
	}
	m.clientMu.RUnlock()
	for _, id := range dead {
		var n int
		var bytes uint64
		for _, idx := range m.alloc.ByClient(id) {
			s, ok := m.alloc.Segment(idx)
			if !ok {
				continue
			}
			if err := m.unmountLocked(s, false); err != nil {
				m.cfg.Logger.Error("master: unmounting an expired client's segment", "segment", s.ID.String(), "err", err)
				continue
			}
			n, bytes = n+1, bytes+s.Size
		}
		m.cfg.Logger.Info("master: client expired; its segments unmounted", "client", id.String(), "segments", n, "size", bytes,
			"ttl", m.cfg.ClientTTL)
		m.expiredClients.Add(1)
		if err := m.apply(nil, 0, &Op{Kind: OpClientExpired, Time: now, Client: id}, &applyArgs{}); err != nil {
			m.cfg.Logger.Error("master: forgetting an expired client", "client", id.String(), "err", err)
		}
	}
}
