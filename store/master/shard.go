package master

import (
	"encoding/binary"
	"sync"
	"unsafe"
)

// shard holds the objects of the keys that hash to it, in three
// structures sized for tens of millions of keys (doc.go, "Concurrency and
// memory"):
//
//   - a slab of 56-byte records in chunks of slabChunk (one 4 KiB size
//     class each, so growth never copies and leaves no slack beyond the
//     last chunk);
//   - an append-only arena of entries: the record's slot (4 bytes, dead
//     for a removed key), the key's length (uvarint), the key. Key bytes
//     once written are never modified (compaction copies to new chunks),
//     so a string aliasing them stays valid and immutable while held;
//   - an open-addressing index of 8-byte entries (the key hash's high 32
//     bits, the arena reference + 1), linear probing from fastrange(tag),
//     backward-shift deletion. A tag match is confirmed against the arena
//     bytes, so a full hash collision costs a comparison, never a wrong
//     answer; the hash seed is the master's (random), against flooding.
//     One hash serves both choices: Master.locate picks the shard with
//     its low bits and the shard's methods take it for the tag, so a
//     key is hashed once per operation.
type shard struct {
	mu      sync.Mutex
	n       int        // live keys
	tab     []uint64   // index: tag<<32 | arena ref + 1; 0 is empty
	objs    [][]object // slab chunks; free slots are zero and listed in free
	nslots  int        // slots in use or free (the slab's length)
	free    []uint32
	keys    [][]byte // arena chunks
	keyUsed int      // arena bytes written
	keyDead int      // of which removed keys'
	pending int      // unfinished puts, so the release scan skips idle shards
}

const (
	slabChunk  = 73   // 73 * 56 = 4088 bytes: one 4 KiB size class
	keyChunk   = 4096 // arena chunk; a longer entry gets a chunk of its own
	keyOffBits = 12   // an arena reference is chunk<<12 | offset
	maxChunks  = 1<<(32-keyOffBits) - 1
	deadSlot   = ^uint32(0)
	// The index grows by a quarter when more than 13/16 full: between 65%
	// and 81% full, 10 to 12 bytes a key.
	tabMinLen = 8
)

func (sh *shard) obj(slot uint32) *object {
	return &sh.objs[slot/slabChunk][slot%slabChunk]
}

// entry decodes the arena entry at ref: its bytes from the slot on, its
// slot, and its key (aliasing the arena) and the entry's length.
func entry(keys [][]byte, ref uint32) (b []byte, slot uint32, key string, n int) {
	b = keys[ref>>keyOffBits][ref&(1<<keyOffBits-1):]
	l, w := binary.Uvarint(b[4:])
	return b, binary.LittleEndian.Uint32(b), unsafe.String(&b[4+w], int(l)), 4 + w + int(l)
}

// addKey writes an arena entry and returns its reference.
func (sh *shard) addKey(slot uint32, key string) uint32 {
	need := 4 + varintLen(len(key)) + len(key)
	var c []byte
	if len(sh.keys) > 0 {
		c = sh.keys[len(sh.keys)-1]
	}
	if cap(c)-len(c) < need {
		size := keyChunk
		if len(sh.keys) < 4 {
			size = keyChunk >> (4 - len(sh.keys)) // small shards stay small
		}
		if len(sh.keys) >= maxChunks {
			// 4 GiB of keys in one shard: Config.Shards is far too small.
			panic("master: the key arena of a shard is full")
		}
		sh.keys = append(sh.keys, make([]byte, 0, max(size, need)))
		c = sh.keys[len(sh.keys)-1]
	}
	off := len(c)
	c = binary.LittleEndian.AppendUint32(c, slot)
	c = binary.AppendUvarint(c, uint64(len(key)))
	c = append(c, key...)
	sh.keys[len(sh.keys)-1] = c
	sh.keyUsed += need
	return uint32(len(sh.keys)-1)<<keyOffBits | uint32(off)
}

func varintLen(n int) int {
	w := 1
	for ; n >= 0x80; n >>= 7 {
		w++
	}
	return w
}

func (sh *shard) home(tag uint64) int { return int(tag * uint64(len(sh.tab)) >> 32) }

// find returns the index position of key, whose hash is h
// (Master.locate), or of the empty entry that ends its probe, its arena
// reference and its slot.
func (sh *shard) find(key string, h uint64) (pos int, ref, slot uint32, ok bool) {
	if len(sh.tab) == 0 {
		return -1, 0, 0, false
	}
	tag := h >> 32
	i := sh.home(tag)
	for {
		e := sh.tab[i]
		if e == 0 {
			return i, 0, 0, false
		}
		if e>>32 == tag {
			r := uint32(e) - 1
			if _, s, k, _ := entry(sh.keys, r); k == key {
				return i, r, s, true
			}
		}
		if i++; i == len(sh.tab) {
			i = 0
		}
	}
}

func (sh *shard) get(key string, h uint64) *object {
	if _, _, s, ok := sh.find(key, h); ok {
		return sh.obj(s)
	}
	return nil
}

// len is the number of keys.
func (sh *shard) len() int { return sh.n }

// insert adds key (not present), whose hash is h, with record o.
func (sh *shard) insert(key string, h uint64, o object) {
	if (sh.n+1)*16 > len(sh.tab)*13 {
		sh.resize(max(tabMinLen, len(sh.tab)+len(sh.tab)/4))
	}
	var slot uint32
	if n := len(sh.free); n > 0 {
		slot = sh.free[n-1]
		sh.free = sh.free[:n-1]
	} else {
		slot = uint32(sh.nslots)
		sh.grow()
	}
	*sh.obj(slot) = o
	sh.n++
	tag := h >> 32
	i := sh.home(tag)
	for sh.tab[i] != 0 {
		if i++; i == len(sh.tab) {
			i = 0
		}
	}
	sh.tab[i] = tag<<32 | uint64(sh.addKey(slot, key)) + 1
}

// grow adds one slot to the slab. The first chunk grows by doubling so a
// shard of a few keys stays small; later chunks are allocated whole.
func (sh *shard) grow() {
	c := sh.nslots / slabChunk
	if c == len(sh.objs) {
		size := slabChunk
		if c == 0 {
			size = 4
		}
		sh.objs = append(sh.objs, make([]object, 0, size))
	}
	ch := sh.objs[c]
	if len(ch) == cap(ch) {
		nc := make([]object, len(ch), min(2*cap(ch), slabChunk))
		copy(nc, ch)
		ch = nc
	}
	sh.objs[c] = ch[:len(ch)+1]
	sh.nslots++
}

// resize rebuilds the index with n entries (the tags give the positions:
// no key is hashed again).
func (sh *shard) resize(n int) {
	old := sh.tab
	sh.tab = make([]uint64, n)
	for _, e := range old {
		if e == 0 {
			continue
		}
		i := sh.home(e >> 32)
		for sh.tab[i] != 0 {
			if i++; i == n {
				i = 0
			}
		}
		sh.tab[i] = e
	}
}

func (sh *shard) remove(key string, h uint64) {
	pos, ref, slot, ok := sh.find(key, h)
	if !ok {
		return
	}
	sh.deleteAt(pos)
	b, _, _, n := entry(sh.keys, ref)
	binary.LittleEndian.PutUint32(b, deadSlot) // the key bytes stay as they are
	sh.keyDead += n
	*sh.obj(slot) = object{}
	sh.free = append(sh.free, slot)
	sh.n--
}

// deleteAt empties index entry i and shifts back the entries after it
// whose probe passed through it.
func (sh *shard) deleteAt(i int) {
	n := len(sh.tab)
	j := i
	for {
		if j++; j == n {
			j = 0
		}
		e := sh.tab[j]
		if e == 0 {
			break
		}
		h := sh.home(e >> 32)
		// e may move to i if its home is not in (i, j] (cyclically).
		if i <= j && (h <= i || h > j) || i > j && h <= i && h > j {
			sh.tab[i] = e
			i = j
		}
	}
	sh.tab[i] = 0
}

// each calls fn with every key (aliasing the arena: immutable, valid
// while held) and its record, in arena order, until fn returns false. fn
// may remove the key it is given (and others); keys it inserts may or may
// not be seen.
func (sh *shard) each(fn func(key string, o *object) bool) {
	for c := 0; c < len(sh.keys); c++ {
		for off := 0; off < len(sh.keys[c]); {
			_, slot, k, n := entry(sh.keys, uint32(c)<<keyOffBits|uint32(off))
			off += n
			if slot != deadSlot && !fn(k, sh.obj(slot)) {
				return
			}
		}
	}
}

// unlock compacts a slab that is mostly free and an arena that is mostly
// dead (never during an iteration, which always runs under the lock) and
// unlocks.
func (sh *shard) unlock() {
	if n := len(sh.free); n > 0 && (sh.n == 0 || n > 1024 && n > 3*sh.n) {
		sh.compact()
	} else if sh.keyDead > keyChunk && sh.keyDead*2 > sh.keyUsed {
		sh.compactKeys()
	}
	sh.mu.Unlock()
}

// compact moves the records to a new slab and the keys to a new arena.
func (sh *shard) compact() {
	if sh.n == 0 {
		sh.tab, sh.objs, sh.nslots, sh.free = nil, nil, 0, nil
		sh.keys, sh.keyUsed, sh.keyDead = nil, 0, 0
		return
	}
	if len(sh.tab)*13/16 > 3*sh.n {
		sh.resize(max(tabMinLen, 2*sh.n))
	}
	old := sh.objs
	sh.objs, sh.nslots, sh.free = nil, 0, nil
	sh.compactKeys()
	for c := range sh.keys {
		for off := 0; off < len(sh.keys[c]); {
			b, slot, _, n := entry(sh.keys, uint32(c)<<keyOffBits|uint32(off))
			off += n
			s := uint32(sh.nslots)
			sh.grow()
			*sh.obj(s) = old[slot/slabChunk][slot%slabChunk]
			binary.LittleEndian.PutUint32(b, s)
		}
	}
}

// compactKeys copies the live entries to a new arena, in index order.
func (sh *shard) compactKeys() {
	old := sh.keys
	sh.keys, sh.keyUsed, sh.keyDead = nil, 0, 0
	for i, e := range sh.tab {
		if e != 0 {
			_, slot, k, _ := entry(old, uint32(e)-1)
			sh.tab[i] = e>>32<<32 | uint64(sh.addKey(slot, k)) + 1
		}
	}
}
