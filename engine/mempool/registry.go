package mempool

import (
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"
)

// registry lists open pools sorted by base address. Readers load an
// immutable slice; writers copy it under mu.
var registry struct {
	mu    sync.Mutex
	pools atomic.Pointer[[]*Pool]
}

func register(p *Pool) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	var next []*Pool
	if cur := registry.pools.Load(); cur != nil {
		next = append(next, *cur...)
	}
	i := sort.Search(len(next), func(i int) bool { return next[i].base > p.base })
	next = append(next, nil)
	copy(next[i+1:], next[i:])
	next[i] = p
	registry.pools.Store(&next)
}

func unregister(p *Pool) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	cur := registry.pools.Load()
	if cur == nil {
		return
	}
	next := make([]*Pool, 0, len(*cur))
	for _, q := range *cur {
		if q != p {
			next = append(next, q)
		}
	}
	registry.pools.Store(&next)
}

// Lookup reports which open pool's arena holds all of b: the pool's memfd,
// b's offset in it, and the pool. A peer that maps the same memfd (Map)
// finds b's bytes at that offset. The fd belongs to the pool and is closed
// by its Close; dup it to keep it. ok is false when b lies outside every
// open pool or straddles an arena's end.
func Lookup(b []byte) (fd int, offset int64, pool *Pool, ok bool) {
	cur := registry.pools.Load()
	if cur == nil {
		return -1, 0, nil, false
	}
	pools := *cur
	ptr := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	i := sort.Search(len(pools), func(i int) bool { return pools[i].base > ptr }) - 1
	if i < 0 {
		return -1, 0, nil, false
	}
	p := pools[i]
	off, ok := p.Offset(b)
	if !ok {
		return -1, 0, nil, false
	}
	return p.Fd(), off, p, true
}
