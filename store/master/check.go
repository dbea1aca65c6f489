package master

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/crescent-kv/crescent/store/alloc"
)

// CheckInvariants verifies the allocator agrees with the metadata: every
// reserved byte belongs to a live replica or a quarantined one, replicas
// never overlap, replicas of one object are on distinct segments, and the
// counters match the maps.
// It locks one shard, table or queue at a time, so it is exact only on a
// master no change runs on (tests, a replayed standby).
func (m *Master) CheckInvariants() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
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
			bad("shard %d: %d keys + %d free slots != slab of %d", i, sh.len(), len(sh.free), sh.nslots)
		}
		for _, f := range sh.free {
			if *sh.obj(f) != (object{}) {
				bad("shard %d: free slot %d not cleared", i, f)
			}
		}
		live := 0
		for _, e := range sh.tab {
			if e != 0 {
				live++
			}
		}
		if live != sh.len() {
			bad("shard %d: %d index entries for %d keys", i, live, sh.len())
		}
		sh.each(func(k string, o *object) bool {
			if sh.get(k) != o {
				bad("shard %d: key %q not found at its slot", i, k)
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
					bad("key %q: two replicas on segment %d", k, p.Seg)
				}
				segs[p.Seg] = true
				r := alloc.Reserved(o.size())
				sum += r
				per[p.Seg] = append(per[p.Seg], iv{p.Addr, p.Addr + r, strings.Clone(k)})
			}
			return true
		})
		if shPending != sh.pending {
			bad("shard %d: pending %d, counted %d", i, sh.pending, shPending)
		}
		sh.mu.Unlock()
	}
	resv := m.resvCopy(bad)
	var rbytes uint64
	for id, o := range resv {
		if o.complete() || o.owner().IsZero() {
			bad("reservation %d: complete %v owner %v", id, o.complete(), o.owner())
		}
		rbytes += o.size()
		segs := map[uint32]bool{}
		for _, p := range o.placements() {
			if segs[p.Seg] {
				bad("reservation %d: two replicas on segment %d", id, p.Seg)
			}
			segs[p.Seg] = true
			r := alloc.Reserved(o.size())
			sum += r
			per[p.Seg] = append(per[p.Seg], iv{p.Addr, p.Addr + r, fmt.Sprint("reservation:", id)})
		}
		if id > m.resvNext.Load() {
			bad("reservation %d above the last id given, %d", id, m.resvNext.Load())
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
		bad("allocated %d bytes, live replicas hold %d", st.Allocated, sum)
	}
	if st.Reservations != nresv || st.ReservedBytes != rbytes {
		bad("reservations %d of %d bytes; counted %d of %d", st.Reservations, st.ReservedBytes, nresv, rbytes)
	}
	if st.Keys != keys || st.PendingKeys != pending || st.SoftPinnedKeys != soft || st.HardPinnedKeys != hard || st.Quarantined != q {
		bad("counters %+v; counted keys %d pending %d soft %d hard %d quarantined %d", st, keys, pending, soft, hard, q)
	}
	var segUsed uint64
	for _, s := range m.AllSegments() {
		segUsed += s.Used
	}
	if segUsed != st.Allocated {
		bad("segments use %d, allocator total %d", segUsed, st.Allocated)
	}
	for seg, ivs := range per {
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].lo < ivs[j].lo })
		for i := 1; i < len(ivs); i++ {
			if ivs[i].lo < ivs[i-1].hi {
				bad("segment %d: %q [%#x,%#x) overlaps %q [%#x,%#x)", seg, ivs[i-1].key, ivs[i-1].lo, ivs[i-1].hi, ivs[i].key, ivs[i].lo, ivs[i].hi)
			}
		}
	}
	return errors.Join(errs...)
}

// resvCopy copies the reservation tables (one lock at a time); with
// bad, it checks each reservation is in its owner's table.
func (m *Master) resvCopy(bad func(string, ...any)) map[uint64]object {
	out := map[uint64]object{}
	for i := range m.resv {
		rs := &m.resv[i]
		rs.mu.Lock()
		for id, o := range rs.m {
			if bad != nil && m.resvOf(o.owner()) != rs {
				bad("reservation %d not in its owner's table", id)
			}
			out[id] = o
		}
		rs.mu.Unlock()
	}
	return out
}
