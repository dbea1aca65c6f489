package transport

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Region is one registered buffer.
type Region struct {
	Addr     uint64
	Mem      []byte
	Location string
	// FdOffset is Mem's offset in its backing memfd, when it has one.
	FdOffset int64
	// FdSize is the size of the whole memfd.
	FdSize int64

	fdMu sync.RWMutex
	fd   int // the registry's own descriptor of the memfd, or -1

	users    atomic.Int64 // transfers currently touching the region
	dead     atomic.Bool
	idle     chan struct{} // closed (after the fd) when dead and users reaches 0
	idleOnce sync.Once
}

// Idle returns a channel closed once the region is removed and its last
// user left: then nothing of the registry touches its memory any more.
func (r *Region) Idle() <-chan struct{} { return r.idle }

// Shareable reports whether the region is backed by a memfd that
// same-host peers can map.
func (r *Region) Shareable() bool {
	r.fdMu.RLock()
	defer r.fdMu.RUnlock()
	return r.fd >= 0
}

// DupFd returns a new descriptor of the region's memfd, owned by the
// caller.
func (r *Region) DupFd() (int, error) {
	r.fdMu.RLock()
	defer r.fdMu.RUnlock()
	if r.fd < 0 {
		return -1, fmt.Errorf("%w: region %#x has no memfd", ErrNotSupported, r.Addr)
	}
	return unix.FcntlInt(uintptr(r.fd), unix.F_DUPFD_CLOEXEC, 0)
}

// closeFd drops the registry's memfd descriptor.
func (r *Region) closeFd() {
	r.fdMu.Lock()
	defer r.fdMu.Unlock()
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}

// Len is the region's length in bytes.
func (r *Region) Len() uint64 { return uint64(len(r.Mem)) }

// End is one past the region's last address.
func (r *Region) End() uint64 { return r.Addr + uint64(len(r.Mem)) }

// Contains reports whether [addr, addr+n) lies inside the region.
func (r *Region) Contains(addr, n uint64) bool {
	return addr >= r.Addr && n <= r.Len() && addr-r.Addr <= r.Len()-n
}

// release drops one user; the last user of a dead region closes its
// memfd and wakes the unregistering goroutine.
func (r *Region) release() {
	if r.users.Add(-1) == 0 && r.dead.Load() {
		r.finish()
	}
}

// finish ends a dead region with no users: its memfd descriptor is closed
// before Idle fires, so nothing keeps the memory alive afterwards.
func (r *Region) finish() {
	r.idleOnce.Do(func() {
		r.closeFd()
		close(r.idle)
	})
}

// Lease is a checked, pinned view of registered memory: the region cannot
// be unregistered until Release.
type Lease struct {
	Mem []byte
	r   *Region
}

// Release unpins the region. A zero Lease is a no-op.
func (l Lease) Release() {
	if l.r != nil {
		l.r.release()
	}
}

// Registry is the set of local buffers remote peers may touch. Lookups are
// lock-free (a copy-on-write sorted slice); changes take a mutex.
//
// A Remove that times out leaves its region draining: out of the table
// (no new user finds it), its memfd open until the last user leaves, and
// findable by a retried Remove until one reports it gone.
type Registry struct {
	mu       sync.Mutex
	regions  atomic.Pointer[[]*Region]
	draining map[uint64]*Region // by Addr; removed from the table, not yet confirmed gone
	version  atomic.Uint64
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	r := &Registry{draining: make(map[uint64]*Region)}
	empty := []*Region{}
	r.regions.Store(&empty)
	return r
}

// AddrOf returns the virtual address of b's first byte.
func AddrOf(b []byte) uint64 {
	if cap(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// Add registers mem. fd, when not -1, is a memfd holding mem at fdOffset;
// the registry keeps its own duplicate until the region is removed. Add
// fails if mem is empty or overlaps a registered region.
func (g *Registry) Add(mem []byte, location string, fd int, fdOffset, fdSize int64) (*Region, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("%w: empty buffer", ErrInvalidAddress)
	}
	r := &Region{Addr: AddrOf(mem), Mem: mem, Location: location, fd: -1, FdOffset: fdOffset, FdSize: fdSize, idle: make(chan struct{})}
	if fd >= 0 {
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("transport: dup memfd: %w", err)
		}
		r.fd = dup
	}
	if r.Addr+r.Len() < r.Addr {
		r.closeFd()
		return nil, fmt.Errorf("%w: buffer wraps the address space", ErrInvalidAddress)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for a, d := range g.draining {
		if d.Addr < r.End() && r.Addr < d.End() {
			select {
			case <-d.idle:
				delete(g.draining, a) // gone; nobody retried its Remove
			default:
				r.closeFd()
				return nil, fmt.Errorf("%w: [%#x,%#x) overlaps [%#x,%#x), still in use since its removal", ErrAlreadyExists, r.Addr, r.End(), d.Addr, d.End())
			}
		}
	}
	old := *g.regions.Load()
	i := sort.Search(len(old), func(i int) bool { return old[i].Addr >= r.Addr })
	if i > 0 && old[i-1].End() > r.Addr {
		r.closeFd()
		return nil, fmt.Errorf("%w: [%#x,%#x) overlaps [%#x,%#x)", ErrAlreadyExists, r.Addr, r.End(), old[i-1].Addr, old[i-1].End())
	}
	if i < len(old) && old[i].Addr < r.End() {
		r.closeFd()
		return nil, fmt.Errorf("%w: [%#x,%#x) overlaps [%#x,%#x)", ErrAlreadyExists, r.Addr, r.End(), old[i].Addr, old[i].End())
	}
	next := make([]*Region, 0, len(old)+1)
	next = append(next, old[:i]...)
	next = append(next, r)
	next = append(next, old[i:]...)
	g.regions.Store(&next)
	g.version.Add(1)
	return r, nil
}

// Remove unregisters the region starting at addr and waits (until ctx
// ends) for transfers that still touch it. New transfers are refused at
// once. When ctx ends first the error wraps ErrBufferBusy and the region
// drains: its memfd closes when its last user leaves, and Remove may be
// called again for it (it then waits again, or returns at once if the
// region is gone by then). A ctx that has ended already does not matter
// when no user is left.
func (g *Registry) Remove(ctx context.Context, addr uint64) (*Region, error) {
	g.mu.Lock()
	old := *g.regions.Load()
	i := sort.Search(len(old), func(i int) bool { return old[i].Addr >= addr })
	var r *Region
	if i < len(old) && old[i].Addr == addr {
		r = old[i]
		next := make([]*Region, 0, len(old)-1)
		next = append(next, old[:i]...)
		next = append(next, old[i+1:]...)
		g.regions.Store(&next)
		g.version.Add(1)
		r.dead.Store(true)
		g.draining[addr] = r
	} else if r = g.draining[addr]; r == nil {
		g.mu.Unlock()
		return nil, fmt.Errorf("%w: no buffer starts at %#x", ErrNotRegistered, addr)
	}
	g.mu.Unlock()
	if r.users.Load() == 0 {
		r.finish()
	}
	select {
	case <-r.idle:
	default:
		select {
		case <-r.idle:
		case <-ctx.Done():
			return r, fmt.Errorf("%w: %d transfers still running: %w", ErrBufferBusy, r.users.Load(), ctx.Err())
		}
	}
	g.mu.Lock()
	if g.draining[addr] == r {
		delete(g.draining, addr)
	}
	g.mu.Unlock()
	return r, nil
}

// Lookup returns the region starting at addr, registered or draining.
func (g *Registry) Lookup(addr uint64) (r *Region, draining bool) {
	rs := *g.regions.Load()
	i := sort.Search(len(rs), func(i int) bool { return rs[i].Addr >= addr })
	if i < len(rs) && rs[i].Addr == addr {
		return rs[i], false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	r = g.draining[addr]
	return r, r != nil
}

// Find returns the region containing [addr, addr+n) without pinning it.
func (g *Registry) Find(addr, n uint64) (*Region, bool) {
	rs := *g.regions.Load()
	i := sort.Search(len(rs), func(i int) bool { return rs[i].End() > addr })
	if i < len(rs) && rs[i].Contains(addr, n) {
		return rs[i], true
	}
	return nil, false
}

// Acquire checks [addr, addr+n) against the registered buffers and pins
// the region holding it. Remote accesses always go through Acquire.
func (g *Registry) Acquire(addr, n uint64) (Lease, error) {
	if n == 0 || addr+n < addr {
		return Lease{}, fmt.Errorf("%w: [%#x,+%d)", ErrInvalidAddress, addr, n)
	}
	for {
		r, ok := g.Find(addr, n)
		if !ok {
			return Lease{}, fmt.Errorf("%w: [%#x,%#x)", ErrOutOfBounds, addr, addr+n)
		}
		r.users.Add(1)
		if r.dead.Load() {
			// Lost a race with Remove: undo and look again (the region is
			// gone from the table by now).
			r.release()
			continue
		}
		off := addr - r.Addr
		return Lease{Mem: r.Mem[off : off+n : off+n], r: r}, nil
	}
}

// Close drops the memfd descriptors of every region still registered or
// draining.
func (g *Registry) Close() {
	for _, r := range g.Regions() {
		r.closeFd()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.draining {
		r.closeFd()
	}
}

// Regions returns a snapshot of the registered regions, sorted by address.
func (g *Registry) Regions() []*Region {
	return *g.regions.Load()
}

// Version increases on every change.
func (g *Registry) Version() uint64 { return g.version.Load() }

// DeadlineOrDefault returns d, or now+def when d is zero.
func DeadlineOrDefault(d time.Time, def time.Duration) time.Time {
	if d.IsZero() {
		return time.Now().Add(def)
	}
	return d
}

// UnconfirmedError is what an Unregisterer returns when peers did not
// confirm they stopped using a buffer: they may still write into it.
// Each channel of Released closes when one such peer can no longer reach
// the memory (it confirmed late, or its connection is gone).
type UnconfirmedError struct {
	Err      error
	Released []<-chan struct{}
}

func (e *UnconfirmedError) Error() string { return e.Err.Error() }

func (e *UnconfirmedError) Unwrap() error { return e.Err }
