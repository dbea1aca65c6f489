package master

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/alloc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

// checkInvariants verifies the allocator agrees with the metadata: every
// reserved byte belongs to a live replica or a quarantined one, replicas
// never overlap, replicas of one object are on distinct segments, and the
// counters match the maps.
// allResv copies the reservation tables (one lock at a time); with t, it
// checks each reservation is in its owner's table.
func allResv(t testing.TB, m *Master) map[uint64]object {
	out := map[uint64]object{}
	for i := range m.resv {
		rs := &m.resv[i]
		rs.mu.Lock()
		for id, o := range rs.m {
			if t != nil && m.resvOf(o.owner()) != rs {
				t.Errorf("reservation %d not in its owner's table", id)
			}
			out[id] = o
		}
		rs.mu.Unlock()
	}
	return out
}

func checkInvariants(t testing.TB, m *Master) {
	t.Helper()
	type iv struct {
		lo, hi uint64
		key    string
	}
	per := map[uint32][]iv{}
	var sum uint64
	var keys, pending, soft, hard int64
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		shPending := 0
		if sh.len()+len(sh.free) != sh.nslots {
			t.Errorf("shard %d: %d keys + %d free slots != slab of %d", i, sh.len(), len(sh.free), sh.nslots)
		}
		for _, f := range sh.free {
			if *sh.obj(f) != (object{}) {
				t.Errorf("shard %d: free slot %d not cleared", i, f)
			}
		}
		live := 0
		for _, e := range sh.tab {
			if e != 0 {
				live++
			}
		}
		if live != sh.len() {
			t.Errorf("shard %d: %d index entries for %d keys", i, live, sh.len())
		}
		sh.each(func(k string, o *object) bool {
			if sh.get(k, m.hash(k)) != o {
				t.Errorf("shard %d: key %q not found at its slot", i, k)
			}
			keys++
			if !o.complete() {
				pending++
				shPending++
			}
			if o.has(fSoftPin) {
				soft++
			}
			if o.has(fHardPin) {
				hard++
			}
			segs := map[uint32]bool{}
			for _, p := range o.placements() {
				if segs[p.Seg] {
					t.Errorf("key %q: two replicas on segment %d", k, p.Seg)
				}
				segs[p.Seg] = true
				r := alloc.Reserved(o.size())
				sum += r
				per[p.Seg] = append(per[p.Seg], iv{p.Addr, p.Addr + r, strings.Clone(k)})
			}
			return true
		})
		if shPending != sh.pending {
			t.Errorf("shard %d: pending %d, counted %d", i, sh.pending, shPending)
		}
		sh.mu.Unlock()
	}
	resv := allResv(t, m)
	var rbytes uint64
	for id, o := range resv {
		if o.complete() || o.owner().IsZero() {
			t.Errorf("reservation %d: complete %v owner %v", id, o.complete(), o.owner())
		}
		rbytes += o.size()
		segs := map[uint32]bool{}
		for _, p := range o.placements() {
			if segs[p.Seg] {
				t.Errorf("reservation %d: two replicas on segment %d", id, p.Seg)
			}
			segs[p.Seg] = true
			r := alloc.Reserved(o.size())
			sum += r
			per[p.Seg] = append(per[p.Seg], iv{p.Addr, p.Addr + r, fmt.Sprint("reservation:", id)})
		}
		if id > m.resvNext.Load() {
			t.Errorf("reservation %d above the last id given, %d", id, m.resvNext.Load())
		}
	}
	nresv := len(resv)
	m.discardMu.Lock()
	var q int64
	for _, d := range m.discarded {
		for _, p := range d.ps {
			r := alloc.Reserved(d.size)
			sum += r
			q++
			per[p.Seg] = append(per[p.Seg], iv{p.Addr, p.Addr + r, "quarantined:" + d.key})
		}
	}
	m.discardMu.Unlock()
	st := m.Stats()
	if st.Allocated != sum {
		t.Errorf("allocated %d bytes, live replicas hold %d", st.Allocated, sum)
	}
	if st.Reservations != nresv || st.ReservedBytes != rbytes {
		t.Errorf("reservations %d of %d bytes; counted %d of %d", st.Reservations, st.ReservedBytes, nresv, rbytes)
	}
	if st.Keys != keys || st.PendingKeys != pending || st.SoftPinnedKeys != soft || st.HardPinnedKeys != hard || st.Quarantined != q {
		t.Errorf("counters %+v; counted keys %d pending %d soft %d hard %d quarantined %d", st, keys, pending, soft, hard, q)
	}
	var segUsed uint64
	for _, s := range m.AllSegments() {
		segUsed += s.Used
	}
	if segUsed != st.Allocated {
		t.Errorf("segments use %d, allocator total %d", segUsed, st.Allocated)
	}
	for seg, ivs := range per {
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].lo < ivs[j].lo })
		for i := 1; i < len(ivs); i++ {
			if ivs[i].lo < ivs[i-1].hi {
				t.Errorf("segment %d: %q [%#x,%#x) overlaps %q [%#x,%#x)", seg, ivs[i-1].key, ivs[i-1].lo, ivs[i-1].hi, ivs[i].key, ivs[i].lo, ivs[i].hi)
			}
		}
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
