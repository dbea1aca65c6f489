package local

import (
	"container/list"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/store"
)

// block is one fixed-size block of the cache arena.
type block struct {
	idx  int
	off  int64
	mem  []byte // the whole block
	key  string // published under key (when pub)
	n    int    // value size
	refs int    // views handed out and reads in progress
	pub  bool
	loc  store.Location // where the bytes came from, and the lease
	elem *list.Element  // in lru while pub
}

// bytes is the cached value.
func (b *block) bytes() []byte { return b.mem[:b.n:b.n] }

// cache is the local hot cache: a memfd arena cut into fixed blocks, an
// index of published blocks in LRU order, reference counts between get
// and release, and a frequency sketch for admission. Fills carry a token
// taken before the read starts; invalidation withdraws the key's token,
// so a fill that raced with an overwrite or a remove is never published
// (the reference's dirty read).
type cache struct {
	pool      *mempool.Pool
	blockSize int
	threshold int

	mu     sync.Mutex
	blocks []*block
	free   []*block
	lru    *list.List // front = most recent; values *block
	index  map[string]*block
	fills  map[string]uint64 // key -> token of the fill in progress
	seq    uint64
	sketch *sketch

	hits, misses, admissions, evictions, invalidations atomic.Uint64
	used                                               atomic.Int64 // bytes of published values

	// beforePublish runs in a fill after its read, before publishing
	// (tests).
	beforePublish func(key string)
}

func newCache(size, blockSize int64, threshold int) (*cache, error) {
	if blockSize <= 0 || size < blockSize {
		return nil, fmt.Errorf("local: hot cache of %d bytes cannot hold one block of %d", size, blockSize)
	}
	n := size / blockSize
	p, err := mempool.New(mempool.Options{Size: n * blockSize, SlabSize: slabFor(blockSize), Name: "crescent-hot-cache"})
	if err != nil {
		return nil, fmt.Errorf("local: hot cache: %w", err)
	}
	c := &cache{pool: p, blockSize: int(blockSize), threshold: threshold, lru: list.New(),
		index: map[string]*block{}, fills: map[string]uint64{}, sketch: newSketch(int(n) * 16)}
	mem := p.Bytes()
	for i := range int(n) {
		off := int64(i) * blockSize
		b := &block{idx: i, off: off, mem: mem[off : off+blockSize : off+blockSize]}
		c.blocks = append(c.blocks, b)
		c.free = append(c.free, b)
	}
	return c, nil
}

// slabFor is a slab size the pool accepts for blocks of n bytes (the
// cache never allocates from the pool: it only needs the arena).
func slabFor(n int64) int64 {
	s := int64(mempool.MinSlabSize)
	for s < n && s < mempool.DefaultSlabSize {
		s <<= 1
	}
	for n%s != 0 && s > mempool.MinSlabSize {
		s >>= 1
	}
	return s
}

func (c *cache) close() error { return c.pool.Close() }

// admit counts a miss of key and reports whether it is now frequent
// enough to cache. Hits do not count (the reference's rule: a cached key
// must not make itself hotter).
func (c *cache) admit(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sketch.increment(key) >= c.threshold
}

// acquire returns key's published block with a reference, or nil.
func (c *cache) acquire(key string) *block {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.index[key]
	if b == nil {
		return nil
	}
	b.refs++
	c.lru.MoveToFront(b.elem)
	return b
}

// renew records a new lease for b if it is still key's block, and
// reports whether it is (an invalidation may have withdrawn it while the
// master was asked).
func (c *cache) renew(b *block, loc store.Location) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b.pub {
		b.loc.Deadline = loc.Deadline
	}
	return b.pub
}

// release drops one reference; an unpublished block with none left is
// free again.
func (c *cache) release(b *block) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b.refs <= 0 {
		panic("local: hot cache block released more often than acquired")
	}
	if b.refs--; b.refs == 0 && !b.pub {
		c.free = append(c.free, b)
	}
}

// startFill takes a fill token for key: 0 when a fill is already on its
// way.
func (c *cache) startFill(key string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.fills[key]; ok {
		return 0
	}
	c.seq++
	c.fills[key] = c.seq
	return c.seq
}

// cancelFill gives a token back unused.
func (c *cache) cancelFill(key string, tok uint64) {
	c.mu.Lock()
	if c.fills[key] == tok {
		delete(c.fills, key)
	}
	c.mu.Unlock()
}

// take returns a block to fill, with one reference: a free one, else the
// least recently used published block nobody holds; nil when every block
// is held.
func (c *cache) take() *block {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.free); n > 0 {
		b := c.free[n-1]
		c.free = c.free[:n-1]
		b.refs = 1
		return b
	}
	for e := c.lru.Back(); e != nil; e = e.Prev() {
		b := e.Value.(*block)
		if b.refs == 0 {
			c.unpublishLocked(b)
			c.free = c.free[:len(c.free)-1] // unpublish freed it: take it back
			c.evictions.Add(1)
			b.refs = 1
			return b
		}
	}
	return nil
}

// publish makes b (filled with n bytes of key, read from loc) key's
// block, if tok is still key's fill token. It reports whether it did.
func (c *cache) publish(key string, tok uint64, b *block, n int, loc store.Location) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tok == 0 || c.fills[key] != tok {
		return false
	}
	delete(c.fills, key)
	if old := c.index[key]; old != nil {
		c.unpublishLocked(old)
	}
	b.key, b.n, b.loc, b.pub = key, n, loc, true
	b.elem = c.lru.PushFront(b)
	c.index[key] = b
	c.used.Add(int64(n))
	c.admissions.Add(1)
	return true
}

// invalidate withdraws key: its fill in progress will not publish, and
// its published block serves no new reader (current holders keep their
// view of the old bytes until they release it; the block is not reused
// before).
func (c *cache) invalidate(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.fills, key)
	if b := c.index[key]; b != nil {
		c.unpublishLocked(b)
		c.invalidations.Add(1)
	}
}

// Invalidate implements store.InvalidationHandler: the master says
// these keys' values are gone.
func (c *cache) Invalidate(keys []string) {
	for _, k := range keys {
		c.invalidate(k)
	}
}

// InvalidateAll implements store.InvalidationHandler: every block and
// every fill in progress is withdrawn (views handed out stay readable
// until released).
func (c *cache) InvalidateAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.fills)
	for _, b := range c.index {
		c.unpublishLocked(b)
		c.invalidations.Add(1)
	}
}

func (c *cache) unpublishLocked(b *block) {
	delete(c.index, b.key)
	c.lru.Remove(b.elem)
	b.elem, b.pub = nil, false
	c.used.Add(-int64(b.n))
	if b.refs == 0 {
		c.free = append(c.free, b)
	}
}

// held is the number of references out (tests).
func (c *cache) held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, b := range c.blocks {
		n += b.refs
	}
	return n
}

// leaseValid reports whether a lease ending at deadline runs past now + margin.
func leaseValid(deadline, now time.Time, margin time.Duration) bool {
	return now.Add(margin).Before(deadline)
}

// sameReplica reports whether loc still points at the replica the
// block's bytes came from.
func sameReplica(a, b store.Location) bool {
	if a.Size != b.Size || len(a.Replicas) == 0 || len(b.Replicas) == 0 {
		return false
	}
	for _, r := range b.Replicas {
		if r == a.Replicas[0] {
			return true
		}
	}
	return false
}
