package master

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/internal/testlog"
	"github.com/crescent-kv/crescent/store/alloc"
)

func TestMain(m *testing.M) {
	testlog.QuietDefault() // masters with a nil Logger log at info
	goleak.VerifyTestMain(m)
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// opRecorder is an OpSink keeping every op.
type opRecorder struct {
	mu  sync.Mutex
	ops []*Op
}

func (r *opRecorder) Append(op *Op) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

func (r *opRecorder) all() []*Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// eventRecorder is an EventSink keeping every event.
type eventRecorder struct {
	mu  sync.Mutex
	evs []*Event
}

func (r *eventRecorder) Emit(e *Event) {
	r.mu.Lock()
	r.evs = append(r.evs, e)
	r.mu.Unlock()
}

func (r *eventRecorder) take() []*Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.evs
	r.evs = nil
	return out
}

type env struct {
	t   testing.TB
	m   *Master
	clk *clock.Fake
	log *opRecorder
	ev  *eventRecorder
	n   int // segments mounted, for unique IDs
}

// newEnv returns a master on a fake clock, recording ops and events. Small
// shard count keeps whole-table scans cheap in tests.
func newEnv(t testing.TB, mutate func(*Config)) *env {
	t.Helper()
	e := &env{t: t, clk: clock.NewFake(t0), log: &opRecorder{}, ev: &eventRecorder{}}
	cfg := Config{Shards: 8, Clock: e.clk, OpLog: e.log, Events: e.ev, Seed: 1}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	t.Cleanup(func() { m.Close() })
	return e
}

func cl(n uint64) UUID { return UUID{Hi: 0xc1, Lo: n} }

// mount mounts a segment of size bytes named name for client c.
func (e *env) mount(c UUID, name string, size uint64) alloc.Segment {
	e.t.Helper()
	e.n++
	s := alloc.Segment{ID: UUID{Hi: 0x5e, Lo: uint64(e.n)}, Name: name, Base: uint64(e.n) << 40, Size: size, Protocol: "tcp"}
	if err := e.m.MountSegment(c, s); err != nil {
		e.t.Fatal(err)
	}
	s.Client = c
	return s
}

// put stores a complete object.
func (e *env) put(c UUID, key string, size uint64, rc ReplicateConfig) []Replica {
	e.t.Helper()
	reps, err := e.m.PutStart(c, key, size, rc)
	if err != nil {
		e.t.Fatalf("PutStart(%q): %v", key, err)
	}
	if err := e.m.PutEnd(c, key, Memory, nil); err != nil {
		e.t.Fatalf("PutEnd(%q): %v", key, err)
	}
	return reps
}

func (e *env) exists(key string) bool {
	e.t.Helper()
	ok, err := e.m.ExistKey(key, true)
	if err != nil {
		e.t.Fatal(err)
	}
	return ok
}

func wantErr(t testing.TB, what string, err, want error) {
	t.Helper()
	if want == nil && err != nil || want != nil && !errors.Is(err, want) {
		t.Fatalf("%s: err %v, want %v", what, err, want)
	}
}

// allResv copies the reservation tables (one lock at a time); with t, it
// checks each reservation is in its owner's table.
func allResv(t testing.TB, m *Master) map[uint64]object {
	if t == nil {
		return m.resvCopy(nil)
	}
	return m.resvCopy(t.Errorf)
}

// checkInvariants: see Master.CheckInvariants.
func checkInvariants(t testing.TB, m *Master) {
	t.Helper()
	if err := m.CheckInvariants(); err != nil {
		t.Error(err)
	}
}

// state is everything a replayed master must reproduce.
type state struct {
	objs       map[string]string
	segs       []string
	quarantine []string
	clients    []string
	resv       []string
}

func dumpState(m *Master) state {
	s := state{objs: map[string]string{}}
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.each(func(k string, o *object) bool {
			var b strings.Builder
			fmt.Fprintf(&b, "size=%d complete=%v soft=%v hard=%v gen=%d", o.size(), o.complete(), o.has(fSoftPin), o.has(fHardPin), o.gen)
			if !o.complete() {
				fmt.Fprintf(&b, " owner=%v start=%d", o.owner(), o.lease)
			}
			if o.ext != nil && o.ext.pinTTL != 0 {
				fmt.Fprintf(&b, " pinttl=%d", o.ext.pinTTL)
			}
			for _, p := range o.placements() {
				fmt.Fprintf(&b, " %d:%#x", p.Seg, p.Addr)
			}
			s.objs[k] = b.String()
			return true
		})
		sh.mu.Unlock()
	}
	for _, st := range m.alloc.Segments() {
		s.segs = append(s.segs, fmt.Sprintf("%d %v %s used=%d allocs=%d largest=%d unmounting=%v client=%v",
			st.Index, st.Segment.ID, st.Segment.Name, st.Used, st.Allocs, st.LargestFree, st.Unmounting, st.Segment.Client))
	}
	for id, o := range allResv(nil, m) {
		var b strings.Builder
		fmt.Fprintf(&b, "%d size=%d owner=%v start=%d soft=%v hard=%v pinttl=%d", id, o.size(), o.owner(), o.lease,
			o.has(fSoftPin), o.has(fHardPin), o.ext.pinTTL)
		for _, p := range o.placements() {
			fmt.Fprintf(&b, " %d:%#x", p.Seg, p.Addr)
		}
		s.resv = append(s.resv, b.String())
	}
	s.resv = append(s.resv, fmt.Sprint("next=", m.resvNext.Load()))
	slices.Sort(s.resv)
	m.discardMu.Lock()
	for _, q := range m.discarded {
		var b strings.Builder
		fmt.Fprintf(&b, "%s size=%d release=%d", q.key, q.size, q.releaseAt)
		for _, p := range q.ps {
			fmt.Fprintf(&b, " %d:%#x", p.Seg, p.Addr)
		}
		s.quarantine = append(s.quarantine, b.String())
	}
	m.discardMu.Unlock()
	slices.Sort(s.quarantine)
	m.clientMu.RLock()
	for id := range m.clients {
		s.clients = append(s.clients, id.String())
	}
	m.clientMu.RUnlock()
	slices.Sort(s.clients)
	return s
}

func diffState(a, b state) string {
	var out []string
	for k, v := range a.objs {
		if w, ok := b.objs[k]; !ok {
			out = append(out, fmt.Sprintf("key %q only in first: %s", k, v))
		} else if v != w {
			out = append(out, fmt.Sprintf("key %q: %s != %s", k, v, w))
		}
	}
	for k, v := range b.objs {
		if _, ok := a.objs[k]; !ok {
			out = append(out, fmt.Sprintf("key %q only in second: %s", k, v))
		}
	}
	if !slices.Equal(a.segs, b.segs) {
		out = append(out, fmt.Sprintf("segments:\n  %v\n  %v", a.segs, b.segs))
	}
	if !slices.Equal(a.quarantine, b.quarantine) {
		out = append(out, fmt.Sprintf("quarantine:\n  %v\n  %v", a.quarantine, b.quarantine))
	}
	if !slices.Equal(a.resv, b.resv) {
		out = append(out, fmt.Sprintf("reservations:\n  %v\n  %v", a.resv, b.resv))
	}
	if !slices.Equal(a.clients, b.clients) {
		out = append(out, fmt.Sprintf("clients: %v != %v", a.clients, b.clients))
	}
	slices.Sort(out)
	if len(out) > 20 {
		out = append(out[:20], fmt.Sprintf("... and %d more", len(out)-20))
	}
	return strings.Join(out, "\n")
}
