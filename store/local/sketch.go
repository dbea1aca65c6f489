package local

import "hash/maphash"

// sketch is a count-min sketch of 4-bit-saturating counters (stored in
// bytes, capped at 15) that halves every counter after sample increments,
// so old popularity fades: the admission filter of the hot cache.
type sketch struct {
	seed   maphash.Seed
	rows   [4][]uint8
	mask   uint64
	adds   int
	sample int
}

func newSketch(width int) *sketch {
	w := 64
	for w < width {
		w <<= 1
	}
	s := &sketch{seed: maphash.MakeSeed(), mask: uint64(w - 1), sample: 10 * w}
	for i := range s.rows {
		s.rows[i] = make([]uint8, w)
	}
	return s
}

// increment counts key once and returns its estimated count.
func (s *sketch) increment(key string) int {
	h := maphash.String(s.seed, key)
	est := 255
	for i := range s.rows {
		j := (h >> (16 * uint(i))) & s.mask
		if s.rows[i][j] < 15 {
			s.rows[i][j]++
		}
		est = min(est, int(s.rows[i][j]))
	}
	if s.adds++; s.adds >= s.sample {
		s.adds = 0
		for i := range s.rows {
			for j := range s.rows[i] {
				s.rows[i][j] >>= 1
			}
		}
	}
	return est
}
