package master

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// ErrClosed is returned by Start after Close.
var ErrClosed = errors.New("master: closed")

// Master is the store's metadata service core: objects and their
// replicas, segments, clients, leases, pins and eviction. It holds no
// data and speaks no protocol; service.go puts gRPC in front of it. Safe
// for concurrent use.
type Master struct {
	cfg   Config
	clk   clock.Clock
	oplog OpSink
	ev    EventSink
	evq   evQueue // events on their way to ev (evqueue.go)
	alloc *alloc.Allocator
	seed  maphash.Seed
	view  uint64

	shards []shard

	unmountHook func() // tests: runs between an unmount's phases

	// segMu serialises the control plane: mount, remount, unmount and
	// client expiry. Lock order (as the code takes them): segMu or evictMu
	// (never both), then shard (one, or all in index order), a
	// reservation table (one),
	// allocator table (only under segMu, with no shard held), discardMu,
	// segments (index order). clientMu is a leaf (applyMount takes it
	// inside the allocator table's lock), and so is evq.mu; the event sink
	// is called (evq.deliver) with at most segMu or evictMu held.
	segMu    sync.Mutex
	clientMu sync.RWMutex
	clients  map[UUID]*client

	discardMu sync.Mutex
	discarded []quarantined

	// Reservations (reserve.go): unfinished objects under no key, by id,
	// in tables by owner (resvOf) so clients do not queue on one mutex.
	resv          []resvShard
	resvNext      atomic.Uint64 // the last id given
	reservedBytes atomic.Int64

	putGen    atomic.Uint64 // the last put generation given (put.go)
	regexFrom atomic.Uint32 // the shard where a RemoveByRegex past its budget stopped

	inval       invRegistry   // hot-cache invalidation subscribers (invalidate.go)
	invTimeouts atomic.Uint64 // barriers that gave up waiting for a subscriber

	evictMu       sync.Mutex
	lastFruitless atomic.Int64 // last watermark round that freed nothing

	softPinned, hardPinned, quarantinedN atomic.Int64

	evictRuns, evictedKeys, evictedBytes, expiredClients   atomic.Uint64
	discardedPuts, releasedPuts, droppedReplicas, lostKeys atomic.Uint64
	segmentReports                                         atomic.Uint64
	// A clean UnmountSegment is not a loss: counted apart.
	departedClients, unmountedReplicas, unmountedKeys atomic.Uint64

	runMu   sync.Mutex
	started bool
	closed  bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

// object is the per-key record, kept small (56 bytes) because the master
// holds tens of millions of them: the first replica inline, times as unix
// nanoseconds, one byte of flags; the key is in the shard's arena
// (shard.go); everything rare (the soft-pin deadline included) lives in
// ext.
type object struct {
	sz uint64
	// lease is overloaded by state: while unfinished, the PutStart time;
	// once complete, the lease deadline if fLeased, else the PutEnd time
	// (the eviction order treats never-leased objects as oldest by it).
	lease int64
	ext   *objExt
	r0    alloc.Placement
	// gen is the low 32 bits of the put generation that created the
	// object (0 for a committed reservation): PutEnd and PutRevoke of
	// another put are refused.
	gen   uint32
	flags uint8
}

const (
	fComplete uint8 = 1 << iota
	fLeased
	fSoftPin
	fHardPin
)

// objExt holds what few objects need.
type objExt struct {
	owner  UUID              // the writer, while unfinished
	more   []alloc.Placement // replicas after the first
	pinTTL int64             // soft-pin TTL other than the default
	pin    int64             // soft-pin deadline (fSoftPin, once complete)
	hashes []uint64          // block hashes for Removed events
}

func (o *object) size() uint64 { return o.sz }

func (o *object) has(f uint8) bool { return o.flags&f != 0 }

func (o *object) set(f uint8) { o.flags |= f }

func newObject(size uint64, lease int64, r0 alloc.Placement, gen uint32) object {
	return object{sz: size, lease: lease, r0: r0, gen: gen}
}

// pin is the soft-pin deadline (0 if none).
func (o *object) pin() int64 {
	if o.ext == nil {
		return 0
	}
	return o.ext.pin
}

// setPin sets the soft-pin deadline (a soft-pinned object keeps ext).
func (o *object) setPin(p int64) {
	if o.ext == nil {
		if p == 0 {
			return
		}
		o.ext = &objExt{}
	}
	o.ext.pin = p
}

func (o *object) complete() bool { return o.has(fComplete) }

// isGen reports whether gen (0: unchecked) is the object's put generation.
func (o *object) isGen(gen uint64) bool { return gen == 0 || uint32(gen) == o.gen }

func (o *object) leased(now int64) bool { return o.has(fLeased) && o.lease > now }

func (o *object) softPinned(now int64) bool { return o.has(fSoftPin) && o.pin() > now }

func (o *object) nrep() int {
	if o.ext == nil {
		return 1
	}
	return 1 + len(o.ext.more)
}

func (o *object) placements() []alloc.Placement {
	ps := make([]alloc.Placement, 0, o.nrep())
	ps = append(ps, o.r0)
	if o.ext != nil {
		ps = append(ps, o.ext.more...)
	}
	return ps
}

func (o *object) owner() UUID {
	if o.ext == nil {
		return UUID{}
	}
	return o.ext.owner
}

// setPlacements replaces the replicas (ps not empty, the object has ext).
func (o *object) setPlacements(ps []alloc.Placement) {
	o.r0 = ps[0]
	o.ext.more = slices.Clip(ps[1:])
	if len(o.ext.more) == 0 {
		o.ext.more = nil
	}
	o.trimExt()
}

// trimExt drops ext when it holds nothing.
func (o *object) trimExt() {
	if e := o.ext; e != nil && e.owner.IsZero() && len(e.more) == 0 && e.pinTTL == 0 && e.pin == 0 && e.hashes == nil {
		o.ext = nil
	}
}

type client struct {
	lastSeen atomic.Int64
	expiring atomic.Bool
}

// quarantined replicas belong to a put that was taken over or force
// removed before it finished: its writer may still be writing, so the
// space is freed only at its PutReleaseTimeout.
type quarantined struct {
	key       string
	ps        []alloc.Placement
	size      uint64
	releaseAt int64
}

// New returns a master. Call Start to run the background loops.
func New(cfg Config) (*Master, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	var opts []alloc.Option
	if cfg.Seed != 0 {
		opts = append(opts, alloc.WithRand(cfg.Seed))
	}
	m := &Master{
		cfg:     cfg,
		clk:     cfg.Clock,
		oplog:   cfg.OpLog,
		ev:      cfg.Events,
		alloc:   alloc.New(cfg.Strategy, opts...),
		seed:    maphash.MakeSeed(),
		view:    cfg.ViewVersion,
		shards:  make([]shard, cfg.Shards),
		clients: map[UUID]*client{},
		resv:    make([]resvShard, resvShards),
		stop:    make(chan struct{}),
	}
	for i := range m.resv {
		m.resv[i].m = map[uint64]object{}
	}
	if m.view == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		m.view = binary.LittleEndian.Uint64(b[:])>>1 | 1 // non-zero
	}
	return m, nil
}

// Config returns the configuration in use (defaults filled in).
func (m *Master) Config() Config { return m.cfg }

// ViewVersion is the value Ping reports: constant for a master's lifetime.
func (m *Master) ViewVersion() uint64 { return m.view }

// Start runs the background loops: an eviction check every EvictInterval
// and a liveness round (client expiry, release of stale puts) every
// LivenessInterval. Decisions use Config.Clock; tests call Tick instead.
// A master that starts with state (restored or promoted) holds removes
// and put ends for InvalidationTTL (see invBarrier).
func (m *Master) Start() error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if m.started {
		return nil
	}
	m.started = true
	m.holdInvalidations()
	m.wg.Add(1)
	go m.loop()
	return nil
}

// Close stops the background loops and waits for them. The metadata
// stays readable; Close is idempotent.
func (m *Master) Close() error {
	m.runMu.Lock()
	if m.closed {
		m.runMu.Unlock()
		return nil
	}
	m.closed = true
	close(m.stop)
	m.runMu.Unlock()
	m.wg.Wait()
	return nil
}

func (m *Master) loop() {
	defer m.wg.Done()
	evict := time.NewTicker(m.cfg.EvictInterval)
	defer evict.Stop()
	live := time.NewTicker(m.cfg.LivenessInterval)
	defer live.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-evict.C:
			m.maybeEvict(m.now())
		case <-live.C:
			now := m.now()
			m.expireClients(now)
			m.releaseStale(now)
		}
	}
}

// Tick runs one round of every background task now: client expiry,
// release of stale unfinished puts and quarantined replicas, and an
// eviction round if usage is above the high watermark.
func (m *Master) Tick() {
	now := m.now()
	m.expireClients(now)
	m.releaseStale(now)
	m.maybeEvict(now)
}

func (m *Master) now() int64 { return m.clk.Now().UnixNano() }

// locate returns key's shard and hash: the shard's methods take the hash
// (the index tag is its high half), so one hash serves a whole operation.
func (m *Master) locate(key string) (*shard, uint64) {
	h := maphash.String(m.seed, key)
	return &m.shards[h%uint64(len(m.shards))], h
}

// hash is key's hash, for a key whose shard is already known.
func (m *Master) hash(key string) uint64 { return maphash.String(m.seed, key) }

func (m *Master) checkKey(key string) error {
	switch {
	case key == "":
		return errcode.New(errcode.InvalidKey, "empty key")
	case len(key) > m.cfg.MaxKeyLen:
		return errcode.New(errcode.InvalidKey, "key of %d bytes exceeds %d", len(key), m.cfg.MaxKeyLen)
	case !utf8.ValidString(key):
		// gRPC refuses invalid UTF-8 in string fields; refuse it in-process too.
		return errcode.New(errcode.InvalidKey, "key is not valid UTF-8")
	}
	return nil
}

// softPinTTL is the object's soft-pin TTL in nanoseconds.
func (m *Master) softPinTTL(o *object) int64 {
	if o.ext != nil && o.ext.pinTTL != 0 {
		return o.ext.pinTTL
	}
	return int64(m.cfg.SoftPinTTL)
}

// grantLease extends the lease (and a soft pin) of a complete object.
func (m *Master) grantLease(o *object, now int64) {
	d := now + int64(m.cfg.LeaseTTL)
	if !o.has(fLeased) || o.lease < d {
		o.lease = d
	}
	o.set(fLeased)
	if o.has(fSoftPin) {
		if p := now + m.softPinTTL(o); p > o.pin() {
			o.setPin(p)
		}
	}
}

// replicas describes an object's replicas.
func (m *Master) replicas(o *object) []Replica {
	return m.appendReplicas(make([]Replica, 0, o.nrep()), o)
}

// appendReplicas appends the description of o's replicas to out.
func (m *Master) appendReplicas(out []Replica, o *object) []Replica {
	st := StatusProcessing
	if o.complete() {
		st = StatusComplete
	}
	add := func(p alloc.Placement) {
		s := m.alloc.SegmentOf(p.Seg)
		out = append(out, Replica{Type: Memory, Status: st, SegmentName: s.Name, SegmentID: s.ID,
			Addr: p.Addr, Size: o.size(), Protocol: s.Protocol})
	}
	add(o.r0)
	if o.ext != nil {
		for _, p := range o.ext.more {
			add(p)
		}
	}
	return out
}
