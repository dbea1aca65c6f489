// Package mastertest is the test bench the master's adapter packages
// (service, admin, kvevents) share: a real master on a fake clock,
// recording its ops and events (as the core's own tests do), with helpers to mount segments and store objects.
// The core's own tests keep their copy in store/master (they cannot import
// a package that imports the core).
package mastertest

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/master"
)

// T0 is the fake clock's start.
var T0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Ops is an OpSink keeping every op.
type Ops struct {
	mu  sync.Mutex
	ops []*master.Op
}

// Append records op.
func (r *Ops) Append(op *master.Op) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// All returns the ops recorded so far.
func (r *Ops) All() []*master.Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// Events is an EventSink keeping every event.
type Events struct {
	mu  sync.Mutex
	evs []*master.Event
}

// Emit records e.
func (r *Events) Emit(e *master.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, e)
	r.mu.Unlock()
}

// Take returns the events recorded since the last Take.
func (r *Events) Take() []*master.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.evs
	r.evs = nil
	return out
}

// Env is a master under test.
type Env struct {
	T   testing.TB
	M   *master.Master
	Clk *clock.Fake
	Log *Ops
	Ev  *Events
	n   int // segments mounted, for unique IDs
}

// New returns a master on a fake clock, recording ops and events. Small shard
// count keeps whole-table scans cheap in tests. The master is closed when
// the test ends.
func New(t testing.TB, mutate func(*master.Config)) *Env {
	t.Helper()
	e := &Env{T: t, Clk: clock.NewFake(T0), Log: &Ops{}, Ev: &Events{}}
	cfg := master.Config{Shards: 8, Clock: e.Clk, OpLog: e.Log, Events: e.Ev, Seed: 1}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := master.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.M = m
	t.Cleanup(func() { m.Close() })
	return e
}

// Mount mounts a segment of size bytes named name for client c.
func (e *Env) Mount(c master.UUID, name string, size uint64) alloc.Segment {
	e.T.Helper()
	e.n++
	s := alloc.Segment{ID: master.UUID{Hi: 0x5e, Lo: uint64(e.n)}, Name: name, Base: uint64(e.n) << 40, Size: size, Protocol: "tcp"}
	if err := e.M.MountSegment(c, s); err != nil {
		e.T.Fatal(err)
	}
	s.Client = c
	return s
}

// Put stores a complete object.
func (e *Env) Put(c master.UUID, key string, size uint64, rc master.ReplicateConfig) []master.Replica {
	e.T.Helper()
	reps, err := e.M.PutStart(c, key, size, rc)
	if err != nil {
		e.T.Fatalf("PutStart(%q): %v", key, err)
	}
	if err := e.M.PutEnd(c, key, master.Memory, nil); err != nil {
		e.T.Fatalf("PutEnd(%q): %v", key, err)
	}
	return reps
}

// Exists is ExistKey without a lease.
func (e *Env) Exists(key string) bool {
	e.T.Helper()
	ok, err := e.M.ExistKey(key, true)
	if err != nil {
		e.T.Fatal(err)
	}
	return ok
}

// Reserve reserves n objects of size bytes for client c.
func (e *Env) Reserve(c master.UUID, size uint64, rc master.ReplicateConfig, n int) []master.Reservation {
	e.T.Helper()
	res := e.M.Reserve(c, master.ReserveSpec{Size: size, Config: rc, Count: n})
	if res.Err != nil || len(res.Reservations) != n {
		e.T.Fatalf("Reserve: %d of %d, %v", len(res.Reservations), n, res.Err)
	}
	return res.Reservations
}
