package rdma

import (
	"fmt"
	"slices"
	"strconv"
)

// wildcard is the reference's location matching any memory.
const wildcard = "*"

// prefs are NIC indices for one memory location: preferred ones (same
// NUMA node / PCIe switch) and the others.
type prefs struct{ preferred, avail []int }

func (p prefs) all() []int { return append(slices.Clip(p.preferred), p.avail...) }

// first spreads first attempts over the preferred NICs (over all of them
// when none is preferred).
func (p prefs) first(ctr uint64) int {
	if len(p.preferred) > 0 {
		return p.preferred[ctr%uint64(len(p.preferred))]
	}
	return p.avail[ctr%uint64(len(p.avail))]
}

// matrix is a priority matrix resolved to NIC indices.
type matrix struct {
	byLoc map[string]prefs
	any   prefs // "*" or every NIC
}

// lookup returns the NICs for a location, falling back to every NIC.
func (m *matrix) lookup(loc string) prefs {
	if p, ok := m.byLoc[loc]; ok && len(p.preferred)+len(p.avail) > 0 {
		return p
	}
	return m.any
}

// resolveMatrix turns a {location: [[preferred],[avail]]} matrix over
// NIC names into indices. Unknown names are an error when strict (our
// own configuration) and skipped otherwise (a peer's). NICs missing from
// an entry are added to its avail list, so every location can fall back
// to every NIC.
func resolveMatrix(names []string, pm map[string][2][]string, strict bool) (matrix, error) {
	idx := make(map[string]int, len(names))
	for i, n := range names {
		idx[n] = i
	}
	every := make([]int, len(names))
	for i := range every {
		every[i] = i
	}
	m := matrix{byLoc: make(map[string]prefs, len(pm)), any: prefs{preferred: every}}
	for loc, lists := range pm {
		var p prefs
		seen := make([]bool, len(names))
		for k, list := range lists {
			for _, n := range list {
				i, ok := idx[n]
				if !ok {
					if strict {
						return matrix{}, fmt.Errorf("%w: priority matrix names unknown NIC %q for %q", ErrConfig, n, loc)
					}
					continue
				}
				if seen[i] {
					continue
				}
				seen[i] = true
				if k == 0 {
					p.preferred = append(p.preferred, i)
				} else {
					p.avail = append(p.avail, i)
				}
			}
		}
		for i, s := range seen {
			if !s {
				p.avail = append(p.avail, i)
			}
		}
		if loc == wildcard {
			m.any = p
		}
		m.byLoc[loc] = p
	}
	return m, nil
}

// numaMatrix is the matrix the reference derives for CPU memory: for the
// node of each NIC, "cpu:<node>" prefers the NICs on that node and may
// use the others; "*" prefers every NIC.
func numaMatrix(names []string, numa []int) map[string][2][]string {
	pm := map[string][2][]string{wildcard: {slices.Clone(names), {}}}
	for _, node := range numa {
		if node < 0 {
			continue
		}
		loc := "cpu:" + strconv.Itoa(node)
		if _, ok := pm[loc]; ok {
			continue
		}
		var pref, other []string
		for i, n := range names {
			if numa[i] == node {
				pref = append(pref, n)
			} else {
				other = append(other, n)
			}
		}
		pm[loc] = [2][]string{pref, append([]string{}, other...)}
	}
	return pm
}

// pathFunc reports whether a (local NIC, peer NIC) pair may carry a
// slice now.
type pathFunc func(l, r int) bool

// choosePath picks the (local, peer) NIC pair of a slice. A first attempt
// spreads over the preferred NICs of both sides with ctr; a retry (and a
// first attempt whose pair is unusable) walks preferred pairs, then all
// pairs, starting at an offset that moves with the retry count, and
// avoids the pair that just failed unless it is the only usable one.
func choosePath(L, R prefs, ctr uint64, retry int, avoidL, avoidR int, usable pathFunc) (int, int, bool) {
	if retry == 0 {
		l, r := L.first(ctr), R.first(ctr)
		if usable(l, r) {
			return l, r, true
		}
	}
	fallbackL, fallbackR := -1, -1
	try := func(ls, rs []int) (int, int, bool) {
		n := len(ls) * len(rs)
		if n == 0 {
			return 0, 0, false
		}
		start := int((ctr + uint64(retry)) % uint64(n))
		for k := 0; k < n; k++ {
			i := (start + k) % n
			l, r := ls[i%len(ls)], rs[i/len(ls)]
			if !usable(l, r) {
				continue
			}
			if l == avoidL && r == avoidR {
				fallbackL, fallbackR = l, r
				continue
			}
			return l, r, true
		}
		return 0, 0, false
	}
	if l, r, ok := try(L.preferred, R.preferred); ok {
		return l, r, true
	}
	if l, r, ok := try(L.all(), R.all()); ok {
		return l, r, true
	}
	if fallbackL >= 0 {
		return fallbackL, fallbackR, true
	}
	return 0, 0, false
}
