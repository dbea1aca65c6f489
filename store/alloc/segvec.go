package alloc

import "slices"

// segChunk is how many segment pointers a segVec chunk holds.
const segChunk = 256

// segVec is the table's segments by index, in chunks of segChunk
// pointers. A new table version copies the chunk list and the chunk it
// changes, not every pointer: with one flat slice, a mount or release
// among 16384 segments copied 128 KB of pointers (under GC write
// barriers) per version.
type segVec struct {
	chunks [][]*segState // all full but the last
	n      int
}

// newSegVec is n nil entries.
func newSegVec(n int) segVec {
	v := segVec{n: n}
	for left := n; left > 0; left -= segChunk {
		v.chunks = append(v.chunks, make([]*segState, min(left, segChunk), segChunk))
	}
	return v
}

func (v *segVec) len() int { return v.n }

// get is entry i, nil when free or past the end.
func (v *segVec) get(i uint32) *segState {
	if int(i) >= v.n {
		return nil
	}
	return v.chunks[i/segChunk][i%segChunk]
}

// at is entry i, which must be below len (an index from the table's
// own lists).
func (v *segVec) at(i uint32) *segState { return v.chunks[i/segChunk][i%segChunk] }

// set stores s at i (< len) in a copy of its chunk, leaving the chunks
// older versions share untouched.
func (v *segVec) set(i uint32, s *segState) {
	v.chunks = slices.Clone(v.chunks)
	c := slices.Clone(v.chunks[i/segChunk])
	c[i%segChunk] = s
	v.chunks[i/segChunk] = c
}

// push appends s (at index len), copying the last chunk likewise.
func (v *segVec) push(s *segState) {
	if v.n%segChunk == 0 {
		v.chunks = append(slices.Clip(v.chunks), make([]*segState, 0, segChunk))
	} else {
		v.chunks = slices.Clone(v.chunks)
	}
	last := len(v.chunks) - 1
	c := make([]*segState, len(v.chunks[last]), segChunk)
	copy(c, v.chunks[last])
	v.chunks[last] = append(c, s)
	v.n++
}
