package bench

import (
	"math"
	"math/bits"
	"time"
)

// Histogram records durations with ~1.6% relative precision in constant
// memory (log-linear buckets: 64 sub-buckets per power of two of
// nanoseconds). Not safe for concurrent use; merge per-goroutine ones.
type Histogram struct {
	counts [64 * 64]uint64
	n      uint64
	max    time.Duration
}

const subBits = 6

func bucketOf(ns uint64) int {
	if ns < 1<<subBits {
		return int(ns)
	}
	e := bits.Len64(ns) - subBits // >= 1
	sub := (ns >> uint(e-1)) & (1<<subBits - 1)
	return e<<subBits | int(sub)
}

// lowerBound is the smallest value of a bucket.
func lowerBound(b int) uint64 {
	e, sub := b>>subBits, uint64(b&(1<<subBits-1))
	if e == 0 {
		return sub
	}
	return (1<<subBits | sub) << uint(e-1)
}

// Record adds one observation.
func (h *Histogram) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	b := bucketOf(uint64(d))
	if b >= len(h.counts) {
		b = len(h.counts) - 1
	}
	h.counts[b]++
	h.n++
	if d > h.max {
		h.max = d
	}
}

// Merge adds o's observations to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	if o.max > h.max {
		h.max = o.max
	}
}

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.n }

// Quantile returns the value below which a fraction q of observations
// fall (the lower bound of the bucket holding it).
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if q >= 1 {
		return h.max
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank == 0 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			v := time.Duration(lowerBound(i))
			if v > h.max {
				v = h.max
			}
			return v
		}
	}
	return h.max
}
