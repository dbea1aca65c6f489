package store

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"sync"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/transport"
)

// region is [addr, end) of registered memory.
type region struct{ addr, end uint64 }

// regions is the set of memory this client knows to be registered with
// its engine: its segments, its staging pool and RegisterBuffer's buffers.
// Sorted by address, non-overlapping (the engine refuses overlaps).
type regions struct {
	mu sync.RWMutex
	rs []region
}

func spanOf(b []byte) region {
	a := transport.AddrOf(b)
	return region{a, a + uint64(len(b))}
}

func (r *regions) add(b []byte) {
	s := spanOf(b)
	r.mu.Lock()
	defer r.mu.Unlock()
	i := sort.Search(len(r.rs), func(i int) bool { return r.rs[i].addr >= s.addr })
	r.rs = append(r.rs, region{})
	copy(r.rs[i+1:], r.rs[i:])
	r.rs[i] = s
}

func (r *regions) remove(b []byte) bool {
	s := spanOf(b)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, x := range r.rs {
		if x == s {
			r.rs = append(r.rs[:i], r.rs[i+1:]...)
			return true
		}
	}
	return false
}

// contains reports whether b lies entirely inside one registered region.
func (r *regions) contains(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	s := spanOf(b)
	r.mu.RLock()
	defer r.mu.RUnlock()
	i := sort.Search(len(r.rs), func(i int) bool { return r.rs[i].end > s.addr })
	return i < len(r.rs) && s.addr >= r.rs[i].addr && s.end <= r.rs[i].end
}

// segment is memory this client contributes to the pool.
type segment struct {
	info    SegmentInfo
	pool    *mempool.Pool
	mem     []byte
	mounted bool // MountSegment succeeded (written before the segment is listed)
}

// slice returns the bytes [addr, addr+n) of the segment, and false when
// they are not all inside it (a replica the master placed wrongly must
// never make us write outside our memory).
func (s *segment) slice(addr, n uint64) ([]byte, bool) {
	if addr < s.info.Base || n > s.info.Size || addr-s.info.Base > s.info.Size-n {
		return nil, false
	}
	off := addr - s.info.Base
	return s.mem[off : off+n : off+n], true
}

// newArena makes a prefaulted memfd pool of at least size bytes. slab is
// the pool's slab size; 0 picks one that keeps the rounding small (at most
// size/1024 + 64 KiB) for memory that is never Alloc'ed from.
func newArena(name string, size, slab int64, overcommit bool) (*mempool.Pool, error) {
	if slab == 0 {
		slab = clampSlab(size / 1024)
	}
	return mempool.New(mempool.Options{Size: size, SlabSize: slab, Name: name, AllowOvercommit: overcommit})
}

// clampSlab is the largest power of two <= n within the pool's slab limits
// and at most the default slab size.
func clampSlab(n int64) int64 {
	slab := int64(mempool.MinSlabSize)
	if n > slab {
		slab = int64(1) << (63 - bits.LeadingZeros64(uint64(n)))
	}
	return min(slab, mempool.DefaultSlabSize)
}

// stager hands out staging buffers: registered memory that carries values
// the caller's memory cannot (it is not registered).
type stager struct {
	pool  *mempool.Pool
	mem   []byte
	chunk int // largest piece staged at once
	// views bounds the bytes GetBuffer keeps from the pool, so transfers
	// always find room and never wait for a caller to release a Buffer.
	views    int64
	viewsMax int64

	mu sync.Mutex
	// freed is closed at the next free, made only when someone waits:
	// most frees have no waiter, and a channel per free was one
	// allocation per staged piece.
	freed chan struct{}
}

// stageChunk is the largest piece moved through one staging buffer, as
// the reference chunks transfers.
const stageChunk = 16 << 20

func newStager(size int64, overcommit bool) (*stager, error) {
	// Slabs of a quarter of the pool (at most 16 MiB): every staged piece
	// fits in one, on the pool's fast path.
	p, err := newArena("crescent-staging", size, clampSlab(size/4), overcommit)
	if err != nil {
		return nil, fmt.Errorf("store: staging pool: %w", err)
	}
	s := &stager{pool: p, mem: p.Bytes(), viewsMax: size / 2}
	// A quarter of the pool per piece: pieces always fit beside the half
	// GetBuffer may hold, despite fragmentation.
	s.chunk = int(min(int64(stageChunk), max(size/4, 4096)))
	return s, nil
}

// signal returns the channel closed at the next free.
func (s *stager) signal() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed == nil {
		s.freed = make(chan struct{})
	}
	return s.freed
}

func (s *stager) tryAlloc(n int) []byte {
	b, err := s.pool.Alloc(n)
	if err != nil {
		return nil
	}
	return b
}

// alloc waits until n bytes are free or ctx ends.
func (s *stager) alloc(ctx context.Context, n int) ([]byte, error) {
	for {
		if b := s.tryAlloc(n); b != nil {
			return b, nil
		}
		// Ask for a signal, then try again: a free between the two tries
		// is seen by the second, any later one closes ch.
		ch := s.signal()
		if b := s.tryAlloc(n); b != nil {
			return b, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *stager) free(b []byte) {
	if err := s.pool.Free(b); err != nil && !errors.Is(err, mempool.ErrClosed) {
		panic("store: staging free: " + err.Error()) // our own bookkeeping is broken
	}
	s.mu.Lock()
	if s.freed != nil {
		close(s.freed)
		s.freed = nil
	}
	s.mu.Unlock()
}

// allocView takes n bytes for a Buffer, or nil when views already hold
// their share of the pool or it has no room.
func (s *stager) allocView(n int) []byte {
	s.mu.Lock()
	if s.views+int64(n) > s.viewsMax {
		s.mu.Unlock()
		return nil
	}
	s.views += int64(n)
	s.mu.Unlock()
	b := s.tryAlloc(n)
	if b == nil {
		s.mu.Lock()
		s.views -= int64(n)
		s.mu.Unlock()
	}
	return b
}

func (s *stager) freeView(b []byte) {
	s.mu.Lock()
	s.views -= int64(len(b))
	s.mu.Unlock()
	s.free(b)
}
