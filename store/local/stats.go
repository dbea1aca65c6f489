package local

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Stats are a Server's counters.
type Stats struct {
	Dummies       int64  // registered now
	Refused       uint64 // registrations refused (uid, version, no hello)
	BadTokens     uint64 // requests with a wrong token (connection closed)
	Expired       uint64 // dummies dropped after ExpireAfter of silence
	Hits, Misses  uint64 // hot cache lookups
	Admissions    uint64 // values published in the cache
	Evictions     uint64 // published values evicted for room
	Invalidations uint64 // published values withdrawn by a write or remove
	FillsDropped  uint64 // admitted values not filled: the fill queue was full
	// StaleMisses are lookups that served nothing cached because the
	// invalidation subscription was not fresh; Resets count drops of the
	// whole cache (a new subscription, a gap, an overflow on the master).
	StaleMisses, Resets uint64
	Fresh               bool   // the subscription is fresh now
	HitBytes            uint64 // bytes served from the cache
	CacheBytes          int64  // bytes of values in the cache now
	CacheCapacity       int64  // the cache's size (0: no cache)
	References          int64  // block references held now (views out, reads in progress)
	// ShareCopies are GetBuffer answers sent as copies because the dummy
	// already held views of its share of the blocks.
	ShareCopies uint64
	// Latency of requests served (from frame read to reply written),
	// in power-of-two microsecond buckets: Latency[i] counts requests
	// that took less than 2^i µs (the last bucket: the rest).
	Latency      [latBuckets]uint64
	LatencyCount uint64
	LatencySum   time.Duration
}

// Quantile is the upper bound of the latency bucket holding quantile q.
func (s Stats) Quantile(q float64) time.Duration {
	if s.LatencyCount == 0 {
		return 0
	}
	want := uint64(q * float64(s.LatencyCount))
	var n uint64
	for i, c := range s.Latency {
		if n += c; n > want || i == latBuckets-1 {
			return time.Duration(1<<i) * time.Microsecond
		}
	}
	return 0
}

const latBuckets = 24

type latency struct {
	b     [latBuckets]atomic.Uint64
	n     atomic.Uint64
	sumNs atomic.Int64
}

func newLatency() *latency { return &latency{} }

func (l *latency) observe(d time.Duration) {
	us := uint64(max(d/time.Microsecond, 0))
	i := min(bits.Len64(us), latBuckets-1)
	l.b[i].Add(1)
	l.n.Add(1)
	l.sumNs.Add(int64(d))
}

type serverStats struct {
	dummies                                 atomic.Int64
	refused, badToken, expired, fillDropped atomic.Uint64
	hitBytes, staleMisses, shareCopies      atomic.Uint64
	lat                                     *latency
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	st := Stats{
		Dummies: s.st.dummies.Load(), Refused: s.st.refused.Load(), BadTokens: s.st.badToken.Load(),
		Expired: s.st.expired.Load(), FillsDropped: s.st.fillDropped.Load(), HitBytes: s.st.hitBytes.Load(),
		ShareCopies:  s.st.shareCopies.Load(),
		LatencyCount: s.st.lat.n.Load(), LatencySum: time.Duration(s.st.lat.sumNs.Load()),
	}
	for i := range st.Latency {
		st.Latency[i] = s.st.lat.b[i].Load()
	}
	if h := s.hot; h != nil {
		st.Hits, st.Misses = h.hits.Load(), h.misses.Load()
		st.Admissions, st.Evictions, st.Invalidations = h.admissions.Load(), h.evictions.Load(), h.invalidations.Load()
		st.CacheBytes, st.CacheCapacity = h.used.Load(), h.pool.Size()
		st.References = int64(h.held())
		st.StaleMisses, st.Resets, st.Fresh = s.st.staleMisses.Load(), s.watch.Resets(), s.watch.Fresh()
	}
	return st
}
