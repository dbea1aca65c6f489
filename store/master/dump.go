package master

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strings"
)

// DumpState writes the master's replicated state as text, one line per
// object, segment, reservation, quarantined entry and client, sorted: two
// masters with the same state write the same bytes, whatever their shard
// counts. It covers what Replay reproduces (not leases, heartbeats or
// counters). Locks are taken one table at a time, so the dump is
// consistent only while no change runs; it is meant for tests and for
// comparing a replica with its leader at rest.
func (m *Master) DumpState(w io.Writer) error {
	var lines []string
	add := func(b *strings.Builder) { lines = append(lines, b.String()) }
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.each(func(k string, o *object) bool {
			var b strings.Builder
			fmt.Fprintf(&b, "key %q size=%d complete=%v soft=%v hard=%v gen=%d", k, o.size(), o.complete(),
				o.has(fSoftPin), o.has(fHardPin), o.gen)
			if !o.complete() {
				fmt.Fprintf(&b, " owner=%v start=%d", o.owner(), o.lease)
			}
			if o.ext != nil && o.ext.pinTTL != 0 {
				fmt.Fprintf(&b, " pinttl=%d", o.ext.pinTTL)
			}
			for _, p := range o.placements() {
				fmt.Fprintf(&b, " %d:%#x", p.Seg, p.Addr)
			}
			add(&b)
			return true
		})
		sh.mu.Unlock()
	}
	for _, st := range m.alloc.Segments() {
		var b strings.Builder
		fmt.Fprintf(&b, "segment %d %v %q base=%#x size=%d proto=%q te=%q used=%d allocs=%d largest=%d unmounting=%v client=%v",
			st.Index, st.Segment.ID, st.Segment.Name, st.Segment.Base, st.Segment.Size, st.Segment.Protocol,
			st.Segment.TEEndpoint, st.Used, st.Allocs, st.LargestFree, st.Unmounting, st.Segment.Client)
		add(&b)
	}
	for i := range m.resv {
		rs := &m.resv[i]
		rs.mu.Lock()
		for id, o := range rs.m {
			var b strings.Builder
			fmt.Fprintf(&b, "reservation %d size=%d owner=%v start=%d soft=%v hard=%v pinttl=%d", id, o.size(), o.owner(),
				o.lease, o.has(fSoftPin), o.has(fHardPin), o.ext.pinTTL)
			for _, p := range o.placements() {
				fmt.Fprintf(&b, " %d:%#x", p.Seg, p.Addr)
			}
			add(&b)
		}
		rs.mu.Unlock()
	}
	lines = append(lines, fmt.Sprint("reservation next=", m.resvNext.Load()))
	m.discardMu.Lock()
	for _, q := range m.discarded {
		var b strings.Builder
		fmt.Fprintf(&b, "quarantined %q size=%d release=%d", q.key, q.size, q.releaseAt)
		for _, p := range q.ps {
			fmt.Fprintf(&b, " %d:%#x", p.Seg, p.Addr)
		}
		add(&b)
	}
	m.discardMu.Unlock()
	m.clientMu.RLock()
	for id := range m.clients {
		lines = append(lines, "client "+id.String())
	}
	m.clientMu.RUnlock()
	slices.Sort(lines)
	bw := bufio.NewWriter(w)
	for _, l := range lines {
		bw.WriteString(l)
		bw.WriteByte('\n')
	}
	return bw.Flush()
}
