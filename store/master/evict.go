package master

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/crescent-kv/crescent/store/alloc"
)

// fruitlessBackoff spaces watermark-triggered rounds after one that freed
// nothing (everything leased or pinned), so the 10ms loop does not rescan
// the whole table for nothing.
const fruitlessBackoff = int64(time.Second)

// maybeEvict runs a round when usage is above the high watermark.
func (m *Master) maybeEvict(now int64) {
	capacity, used := m.alloc.Totals()
	if capacity == 0 || float64(used) <= m.cfg.EvictionHighWatermark*float64(capacity) {
		return
	}
	if last := m.lastFruitless.Load(); last != 0 && now-last < fruitlessBackoff {
		return
	}
	if r := m.evict(now); r.Keys == 0 {
		m.lastFruitless.Store(now)
	} else {
		m.lastFruitless.Store(0)
	}
}

// Evict runs one eviction round now, whatever the usage, and reports it.
func (m *Master) Evict() EvictResult { return m.evict(m.now()) }

// evict frees EvictionRatio of the total capacity: complete objects that
// are not hard-pinned, not leased and (first pass) not soft-pinned,
// oldest first: objects never leased first (by PutEnd time), then by
// lease deadline. If the first pass falls short and soft-pinned objects
// may be evicted, a second pass considers them too. One round at a time.
func (m *Master) evict(now int64) EvictResult {
	m.evictMu.Lock()
	defer m.evictMu.Unlock()
	capacity, _ := m.alloc.Totals()
	res := EvictResult{Target: uint64(float64(capacity) * m.cfg.EvictionRatio)}
	if res.Target == 0 {
		return res
	}
	m.evictRuns.Add(1)
	m.evictPass(now, res.Target, false, &res)
	if res.Bytes < res.Target && !m.cfg.KeepSoftPinned {
		res.Pass2 = true
		m.evictPass(now, res.Target-res.Bytes, true, &res)
	}
	m.evictedKeys.Add(uint64(res.Keys))
	m.evictedBytes.Add(res.Bytes)
	// One line a round; a round that freed nothing (all leased or pinned)
	// repeats every fruitlessBackoff under pressure: debug.
	lvl := slog.LevelInfo
	if res.Keys == 0 {
		lvl = slog.LevelDebug
	}
	m.cfg.Logger.Log(context.Background(), lvl, "master: evicted", "keys", res.Keys, "size", res.Bytes, "target", res.Target,
		"soft_pinned_pass", res.Pass2)
	return res
}

// age orders eviction candidates: lower is older.
type age struct {
	leased bool
	t      int64
}

func (a age) less(b age) bool {
	if a.leased != b.leased {
		return !a.leased
	}
	return a.t < b.t
}

type candidate struct {
	key   string
	sh    *shard
	age   age
	bytes uint64
	r0    alloc.Placement // identity: the key may be replaced meanwhile
}

func (m *Master) evictable(o *object, now int64, soft bool) bool {
	return o.complete() && !o.has(fHardPin) && !o.leased(now) && (soft || !o.softPinned(now))
}

// evictPass selects the oldest evictable objects worth target bytes, one
// shard at a time, then evicts them, re-checking each under its shard
// lock.
func (m *Master) evictPass(now int64, target uint64, soft bool, res *EvictResult) {
	// A max-heap on age (youngest on top) holding just enough bytes.
	var h []candidate
	var sum uint64
	up := func(i int) {
		for i > 0 {
			p := (i - 1) / 2
			if !h[p].age.less(h[i].age) {
				return
			}
			h[p], h[i] = h[i], h[p]
			i = p
		}
	}
	down := func(i int) {
		for {
			l, r, top := 2*i+1, 2*i+2, i
			if l < len(h) && h[top].age.less(h[l].age) {
				top = l
			}
			if r < len(h) && h[top].age.less(h[r].age) {
				top = r
			}
			if top == i {
				return
			}
			h[top], h[i] = h[i], h[top]
			i = top
		}
	}
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.each(func(k string, o *object) bool {
			if !m.evictable(o, now, soft) {
				return true
			}
			c := candidate{key: k, sh: sh, age: age{o.has(fLeased), o.lease},
				bytes: alloc.Reserved(o.size()) * uint64(o.nrep()), r0: o.r0}
			if sum >= target && !c.age.less(h[0].age) {
				return true
			}
			h = append(h, c)
			up(len(h) - 1)
			sum += c.bytes
			// Drop the youngest while the rest still reach the target.
			for len(h) > 1 && sum-h[0].bytes >= target {
				sum -= h[0].bytes
				h[0] = h[len(h)-1]
				h = h[:len(h)-1]
				down(0)
			}
			return true
		})
		sh.unlock()
	}
	slices.SortFunc(h, func(a, b candidate) int {
		switch {
		case a.age.less(b.age):
			return -1
		case b.age.less(a.age):
			return 1
		}
		return 0
	})
	for _, c := range h {
		c.sh.mu.Lock()
		now := m.now()
		h := m.hash(c.key)
		if o := c.sh.get(c.key, h); o != nil && o.r0 == c.r0 && m.evictable(o, now, soft) {
			if err := m.apply(c.sh, h, &Op{Kind: OpEvict, Time: now, Key: strings.Clone(c.key)}, &applyArgs{}); err == nil {
				res.Keys++
				res.Bytes += c.bytes
			} else {
				m.cfg.Logger.Error("master: evicting", "key", c.key, "err", err)
			}
		}
		c.sh.unlock()
		m.flushEvents()
	}
}

// releaseStale frees unfinished puts and reservations older than
// PutReleaseTimeout and quarantined replicas whose release time has come.
func (m *Master) releaseStale(now int64) {
	limit := int64(m.cfg.PutReleaseTimeout)
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		if sh.pending > 0 {
			sh.each(func(k string, o *object) bool {
				if !o.complete() && now-o.lease >= limit {
					m.releasedPuts.Add(1)
					k = strings.Clone(k) // the op outlives the arena's chunk
					if err := m.apply(sh, m.hash(k), &Op{Kind: OpPutRelease, Time: now, Key: k}, &applyArgs{}); err != nil {
						m.cfg.Logger.Error("master: releasing a stale put", "key", k, "err", err)
					}
				}
				return true
			})
		}
		sh.unlock()
	}
	m.releaseStaleReserved(now)
	m.discardMu.Lock()
	defer m.discardMu.Unlock()
	for i := 0; i < len(m.discarded); {
		q := m.discarded[i]
		if q.releaseAt > now {
			i++
			continue
		}
		op := &Op{Kind: OpDiscardFree, Time: now, Key: q.key}
		for _, p := range q.ps {
			op.Segments = append(op.Segments, p.Seg)
			op.Addrs = append(op.Addrs, p.Addr)
		}
		if err := m.freeQuarantined(i, op, &applyArgs{}); err != nil {
			m.cfg.Logger.Error("master: freeing quarantined replicas", "key", q.key, "err", err)
		}
	}
}
