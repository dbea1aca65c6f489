package alloc

import (
	"fmt"
	"slices"

	"github.com/crescent-kv/crescent/internal/offalloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// Range is one range of a segment, used (a placement) or free, as Layout
// reports it. Rank orders free ranges of one size class (0: the next an
// allocation of that class takes).
type Range struct {
	Addr, Size uint64
	Free       bool
	Rank       uint32
}

// Layout returns segment seg's ranges in address order: with Indices,
// what a snapshot needs so that a restored allocator places every later
// allocation exactly where this one would (a replayed log tail then
// reproduces its addresses).
func (a *Allocator) Layout(seg uint32) ([]Range, bool) {
	s := a.seg(seg)
	if s == nil {
		return nil, false
	}
	s.mu.Lock()
	rs := s.oa.Ranges()
	s.mu.Unlock()
	out := make([]Range, len(rs))
	for i, r := range rs {
		out[i] = Range{Addr: s.Base + r.Offset, Size: r.Size, Free: r.Free, Rank: r.Rank}
	}
	return out, true
}

// Indices returns the length of the segment table and the released
// indices Mount reuses (the last one first).
func (a *Allocator) Indices() (n uint32, free []uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tab.Load()
	return uint32(t.segs.len()), slices.Clone(a.free)
}

// RestoreIndices readies an empty allocator so that mounting segments in
// mount order gives them the indices in mounts, and leaves the released
// indices free (as Indices reported them). Every index below n must be in
// exactly one of the two lists.
func (a *Allocator) RestoreIndices(n uint32, free, mounts []uint32) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tab.Load()
	if t.segs.len() != 0 || len(a.free) != 0 {
		return errcode.New(errcode.InvalidParams, "restore into an allocator that has segments")
	}
	if uint64(len(free))+uint64(len(mounts)) != uint64(n) {
		return errcode.New(errcode.InvalidParams, "segment table of %d indices: %d free + %d mounted", n, len(free), len(mounts))
	}
	seen := make([]bool, n)
	for _, l := range [][]uint32{free, mounts} {
		for _, i := range l {
			if i >= n || seen[i] {
				return errcode.New(errcode.InvalidParams, "segment index %d repeated or outside the table of %d", i, n)
			}
			seen[i] = true
		}
	}
	nt := t.clone()
	nt.segs = newSegVec(int(n))
	a.tab.Store(nt)
	a.free = slices.Clone(free)
	for i := len(mounts) - 1; i >= 0; i-- {
		a.free = append(a.free, mounts[i])
	}
	return nil
}

// Restore makes segment seg, just mounted and untouched, hold exactly the
// ranges rs (as Layout reported them) and returns the placements of the
// used ones in address order. It allocates every range in address order
// (free ones in chunks of exact size classes) and then frees the free
// ones by descending rank, so each size class lists them as it did.
func (a *Allocator) Restore(seg uint32, rs []Range) ([]Placement, error) {
	s := a.seg(seg)
	if s == nil {
		return nil, errcode.New(errcode.SegmentNotFound, "segment index %d", seg)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.oa.Stats(); st.Allocs != 0 || s.unmounting {
		return nil, errcode.New(errcode.InvalidParams, "segment %s is in use", s.Name)
	}
	type freed struct {
		rank uint32
		ps   []Placement
		szs  []uint64
	}
	var holes []freed
	used := make([]Placement, 0, len(rs))
	at := s.Base
	for _, r := range rs {
		if r.Addr != at || r.Size == 0 || r.Size%Alignment != 0 || r.Size > s.cap-(at-s.Base) {
			return nil, errcode.New(errcode.InvalidParams, "segment %s: range %#x+%d does not follow %#x within %d bytes",
				s.Name, r.Addr, r.Size, at, s.cap)
		}
		if !r.Free {
			if Reserved(r.Size) != r.Size {
				return nil, errcode.New(errcode.InvalidParams, "segment %s: used range %#x+%d is not a size class", s.Name, r.Addr, r.Size)
			}
			p, err := a.allocLocked(s, r.Size)
			if err != nil {
				return nil, err
			}
			if p.Addr != r.Addr {
				return nil, fmt.Errorf("alloc: segment %s: restore placed %#x at %#x", s.Name, r.Addr, p.Addr)
			}
			used = append(used, p)
		} else {
			h := freed{rank: r.Rank}
			for rem := r.Size; rem > 0; {
				c := offalloc.Class(rem)
				if offalloc.ClassSize(c) > rem {
					c--
				}
				sz := offalloc.ClassSize(c)
				p, err := a.allocLocked(s, sz)
				if err != nil {
					return nil, err
				}
				h.ps = append(h.ps, p)
				h.szs = append(h.szs, sz)
				rem -= sz
			}
			holes = append(holes, h)
		}
		at += r.Size
	}
	if at != s.Base+s.cap {
		return nil, errcode.New(errcode.InvalidParams, "segment %s: ranges cover %d of %d bytes", s.Name, at-s.Base, s.cap)
	}
	slices.SortStableFunc(holes, func(x, y freed) int { return int(y.rank) - int(x.rank) })
	for _, h := range holes {
		for i, p := range h.ps {
			if err := a.freeLocked(s, p, h.szs[i]); err != nil {
				return nil, err
			}
		}
	}
	return used, nil
}
