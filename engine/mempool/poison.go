package mempool

// poisonByte fills freed memory under the invariants build tag so that a
// use after free reads an obvious pattern instead of stale data.
const poisonByte = 0xdb

func poison(b []byte) {
	if len(b) == 0 {
		return
	}
	b[0] = poisonByte
	for i := 1; i < len(b); i *= 2 {
		copy(b[i:], b[:i])
	}
}
