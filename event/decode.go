package event

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/tinylib/msgp/msgp"
)

// DecodeBatch decodes one payload leniently. It accepts:
//
//   - the batch as an array [ts, events] or [ts, events, dp_rank] (extra
//     trailing elements ignored), or as a map {"ts", "events",
//     "data_parallel_rank"};
//   - ts as a float (seconds) or an integer (Mooncake: milliseconds);
//   - events as tag-first arrays (older vLLM), maps tagged under "type"
//     (vLLM >= 0.26), or Mooncake RFC #1527 maps (keyed by "event_type");
//     unknown map keys and extra trailing array elements are ignored;
//   - hashes as integers (signed or unsigned) or bytes.
//
// Events whose tag is not known are skipped and counted in
// EventBatch.Skipped. Anything else that does not fit returns an error
// wrapping ErrMalformed; the decoder never panics and never allocates more
// than the input can describe.
func DecodeBatch(payload []byte) (*EventBatch, error) {
	d := decoder{budget: max(maxExpansion*len(payload), minDecodeBudget)}
	b, rest, err := d.batch(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after batch", ErrMalformed, len(rest))
	}
	return b, nil
}

// decoder carves per-batch slabs so a batch of n events costs a handful of
// allocations instead of several per event.
type decoder struct {
	// budget is what the decode may still allocate by counts the batch
	// announces (see charge).
	budget  int
	hashes  []Hash
	tokens  []uint32
	ints    []int
	stored  []BlockStored
	removed []BlockRemoved
	nevents int
}

func (d *decoder) hashSlab(n int) []Hash {
	if n == 0 {
		return []Hash{}
	}
	if cap(d.hashes)-len(d.hashes) < n {
		d.hashes = make([]Hash, 0, max(n, 128))
	}
	l := len(d.hashes)
	d.hashes = d.hashes[:l+n]
	return d.hashes[l : l+n : l+n]
}

func (d *decoder) tokenSlab(n int) []uint32 {
	if n == 0 {
		return []uint32{}
	}
	if cap(d.tokens)-len(d.tokens) < n {
		d.tokens = make([]uint32, 0, max(n, 1024))
	}
	l := len(d.tokens)
	d.tokens = d.tokens[:l+n]
	return d.tokens[l : l+n : l+n]
}

func (d *decoder) intPtr(v int) *int {
	if len(d.ints) == cap(d.ints) {
		d.ints = make([]int, 0, 64)
	}
	d.ints = append(d.ints, v)
	return &d.ints[len(d.ints)-1]
}

// slabChunk bounds an event slab: the events a header announces may be
// one byte each (skipped ones), so a slab sized by the count could be a
// hundred times the message.
const slabChunk = 256

func (d *decoder) newStored() (*BlockStored, error) { return slabNext(d, &d.stored) }

func (d *decoder) newRemoved() (*BlockRemoved, error) { return slabNext(d, &d.removed) }

// slabNext returns the next element of *slab, starting a new slab of at
// most slabChunk events, charged to d, when it is full.
func slabNext[T any](d *decoder, slab *[]T) (*T, error) {
	if len(*slab) == cap(*slab) {
		n := min(max(d.nevents, 1), slabChunk)
		if err := d.charge(n, int(unsafe.Sizeof(*new(T)))); err != nil {
			return nil, err
		}
		*slab = make([]T, 0, n)
	}
	*slab = (*slab)[:len(*slab)+1]
	return &(*slab)[len(*slab)-1], nil
}

// A batch may decode to maxExpansion times its size, or minDecodeBudget
// if larger: an element of one byte (a fixint hash) can become 32
// (a Hash), so counts alone do not bound the memory.
const (
	maxExpansion    = 8
	minDecodeBudget = 64 << 20
)

// charge takes n elements of size bytes from the budget, before they are
// allocated.
func (d *decoder) charge(n, size int) error {
	if d.budget -= n * size; d.budget < 0 {
		return fmt.Errorf("batch would decode to more than %d times its size", maxExpansion)
	}
	return nil
}

// count is boundCount for an array whose n elements of T are then
// allocated at once: their bytes are charged to d first.
func count[T any](d *decoder, sz uint32, rest []byte) (int, error) {
	n, err := boundCount(sz, 1, rest)
	if err != nil {
		return 0, err
	}
	return n, d.charge(n, int(unsafe.Sizeof(*new(T))))
}

// boundCount rejects a container header larger than the bytes left: every
// element takes at least one byte (two for a map entry).
func boundCount(sz uint32, per int, rest []byte) (int, error) {
	if uint64(sz)*uint64(per) > uint64(len(rest)) {
		return 0, fmt.Errorf("container of %d elements in %d bytes", sz, len(rest))
	}
	return int(sz), nil
}

func (d *decoder) batch(b []byte) (*EventBatch, []byte, error) {
	if len(b) == 0 {
		return nil, b, msgp.ErrShortBytes
	}
	out := &EventBatch{}
	var err error
	switch msgp.NextType(b) {
	case msgp.ArrayType:
		var sz uint32
		if sz, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return nil, b, err
		}
		if sz < 2 {
			return nil, b, fmt.Errorf("batch array has %d elements, want at least 2", sz)
		}
		if out.Timestamp, b, err = readTimestamp(b); err != nil {
			return nil, b, fmt.Errorf("batch timestamp: %w", err)
		}
		if b, err = d.events(b, out); err != nil {
			return nil, b, err
		}
		if sz >= 3 {
			if out.DataParallelRank, b, err = d.optInt(b); err != nil {
				return nil, b, fmt.Errorf("batch data_parallel_rank: %w", err)
			}
		}
		for i := uint32(3); i < sz; i++ {
			if b, err = msgp.Skip(b); err != nil {
				return nil, b, err
			}
		}
		return out, b, nil
	case msgp.MapType:
		var sz uint32
		if sz, b, err = msgp.ReadMapHeaderBytes(b); err != nil {
			return nil, b, err
		}
		var haveTS, haveEvents bool
		for range sz {
			var k []byte
			if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
				return nil, b, err
			}
			switch string(k) {
			case "ts":
				out.Timestamp, b, err = readTimestamp(b)
				haveTS = true
			case "events":
				b, err = d.events(b, out)
				haveEvents = true
			case "data_parallel_rank":
				out.DataParallelRank, b, err = d.optInt(b)
			default:
				b, err = msgp.Skip(b)
			}
			if err != nil {
				return nil, b, fmt.Errorf("batch %q: %w", k, err)
			}
		}
		if !haveTS || !haveEvents {
			return nil, b, fmt.Errorf("batch map lacks ts or events")
		}
		return out, b, nil
	}
	return nil, b, fmt.Errorf("batch is %s, want array", msgp.NextType(b))
}

func readTimestamp(b []byte) (float64, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.Float64Type, msgp.Float32Type:
		return msgp.ReadFloat64Bytes(b)
	case msgp.IntType, msgp.UintType:
		// Mooncake sends integer milliseconds.
		v, neg, rest, err := readAnyInt(b)
		if err != nil {
			return 0, rest, err
		}
		f := float64(v)
		if neg {
			f = float64(int64(v))
		}
		return f / 1000, rest, nil
	}
	return 0, b, fmt.Errorf("timestamp is %s", msgp.NextType(b))
}

func (d *decoder) events(b []byte, out *EventBatch) ([]byte, error) {
	sz, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return b, fmt.Errorf("events: %w", err)
	}
	n, err := boundCount(sz, 1, b)
	if err != nil {
		return b, fmt.Errorf("events: %w", err)
	}
	d.nevents = n
	out.Events = make([]Event, 0, min(n, slabChunk)) // grows with the events decoded
	for i := range n {
		var ev Event
		if ev, b, err = d.event(b); err != nil {
			return b, fmt.Errorf("event %d: %w", i, err)
		}
		if ev == nil {
			out.Skipped++
			continue
		}
		out.Events = append(out.Events, ev)
	}
	return b, nil
}

// event returns (nil, rest, nil) for a well-formed event it does not know.
func (d *decoder) event(b []byte) (Event, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.ArrayType:
		return d.arrayEvent(b)
	case msgp.MapType:
		return d.mapEvent(b)
	}
	rest, err := msgp.Skip(b)
	return nil, rest, err
}

func (d *decoder) arrayEvent(b []byte) (Event, []byte, error) {
	sz, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, b, err
	}
	n, err := boundCount(sz, 1, b)
	if err != nil {
		return nil, b, err
	}
	if n == 0 || msgp.NextType(b) != msgp.StrType {
		return nil, b, skipN(&b, n)
	}
	var tag []byte
	if tag, b, err = msgp.ReadStringZC(b); err != nil {
		return nil, b, err
	}
	left := n - 1
	var ev Event
	switch string(tag) {
	case TagBlockStored:
		if left < 4 {
			return nil, b, fmt.Errorf("BlockStored array has %d fields, want at least 4", left)
		}
		e, err := d.newStored()
		if err != nil {
			return nil, b, err
		}
		if e.BlockHashes, b, err = d.hashList(b); err != nil {
			return nil, b, fmt.Errorf("block_hashes: %w", err)
		}
		if e.ParentBlockHash, b, err = d.optHash(b); err != nil {
			return nil, b, fmt.Errorf("parent_block_hash: %w", err)
		}
		if e.TokenIDs, b, err = d.tokenList(b); err != nil {
			return nil, b, fmt.Errorf("token_ids: %w", err)
		}
		var bs int64
		if bs, b, err = readInt64(b); err != nil {
			return nil, b, fmt.Errorf("block_size: %w", err)
		}
		e.BlockSize = int(bs)
		left -= 4
		// Trailing fields appeared over vLLM releases; older producers
		// send fewer of them.
		for i := 0; i < 7 && left > 0; i++ {
			switch i {
			case 0:
				e.LoraID, b, err = d.optInt(b)
			case 1:
				e.Medium, b, err = readOptString(b)
			case 2:
				e.LoraName, b, err = readOptString(b)
			case 3:
				e.ExtraKeys, b, err = d.readExtraKeys(b)
			case 4:
				e.GroupIdx, b, err = d.optInt(b)
			case 5:
				e.KVCacheSpecKind, b, err = readOptString(b)
			case 6:
				e.KVCacheSpecSlidingWindow, b, err = d.optInt(b)
			}
			if err != nil {
				return nil, b, fmt.Errorf("BlockStored field %d: %w", 5+i, err)
			}
			left--
		}
		ev = e
	case TagBlockRemoved:
		if left < 1 {
			return nil, b, fmt.Errorf("BlockRemoved array has no block_hashes")
		}
		e, err := d.newRemoved()
		if err != nil {
			return nil, b, err
		}
		if e.BlockHashes, b, err = d.hashList(b); err != nil {
			return nil, b, fmt.Errorf("block_hashes: %w", err)
		}
		left--
		for i := 0; i < 2 && left > 0; i++ {
			switch i {
			case 0:
				e.Medium, b, err = readOptString(b)
			case 1:
				e.GroupIdx, b, err = d.optInt(b)
			}
			if err != nil {
				return nil, b, fmt.Errorf("BlockRemoved field %d: %w", 2+i, err)
			}
			left--
		}
		ev = e
	case TagAllBlocksCleared:
		ev = &AllBlocksCleared{}
	case TagBlockUpdate:
		if left < 1 {
			return nil, b, fmt.Errorf("BlockUpdate array has no block_hashes")
		}
		e := &BlockUpdate{}
		if e.BlockHashes, b, err = d.hashList(b); err != nil {
			return nil, b, fmt.Errorf("block_hashes: %w", err)
		}
		left--
		for i := 0; i < 4 && left > 0; i++ {
			switch i {
			case 0:
				e.Medium, b, err = readOptString(b)
			case 1:
				e.ObjectKey, b, err = readOptString(b)
			case 2:
				e.Replicas, b, err = d.readReplicas(b)
			case 3:
				e.GroupIdx, b, err = d.optInt(b)
			}
			if err != nil {
				return nil, b, fmt.Errorf("BlockUpdate field %d: %w", 2+i, err)
			}
			left--
		}
		ev = e
	default:
		// Unknown tag: skip the rest of it.
	}
	return ev, b, skipN(&b, left)
}

func skipN(b *[]byte, n int) error {
	var err error
	for range n {
		if *b, err = msgp.Skip(*b); err != nil {
			return err
		}
	}
	return nil
}

// mapFields collects every key a map event may carry, vLLM's and
// Mooncake's, before the event is built: map keys come in any order.
type mapFields struct {
	tag, eventType                 string
	hashes, seqHashes              []Hash
	haveHashes, haveSeq            bool
	parent, parentHash             *Hash
	tokens                         []uint32
	blockSize                      *int
	loraID, groupIdx, sw, dpRank   *int
	medium, loraName, kind         string
	objectKey, modelName, tenantID string
	backendID, salt, groupID       string
	extraKeys                      [][]any
	replicas                       []Replica
	eventID                        uint64
	timestampMs                    int64
}

func (d *decoder) mapEvent(b []byte) (Event, []byte, error) {
	sz, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return nil, b, err
	}
	n, err := boundCount(sz, 2, b)
	if err != nil {
		return nil, b, err
	}
	var f mapFields
	for range n {
		var k []byte
		if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return nil, b, err
		}
		if b, err = d.mapField(&f, k, b); err != nil {
			return nil, b, fmt.Errorf("%q: %w", k, err)
		}
	}
	if f.eventType != "" {
		ev, err := d.rfcEvent(&f)
		return ev, b, err
	}
	switch f.tag {
	case TagBlockStored:
		if !f.haveHashes {
			return nil, b, fmt.Errorf("BlockStored map lacks block_hashes")
		}
		e, err := d.newStored()
		if err != nil {
			return nil, b, err
		}
		*e = BlockStored{
			BlockHashes: f.hashes, ParentBlockHash: f.parent, TokenIDs: f.tokens,
			LoraID: f.loraID, Medium: f.medium, LoraName: f.loraName, ExtraKeys: f.extraKeys,
			GroupIdx: f.groupIdx, KVCacheSpecKind: f.kind, KVCacheSpecSlidingWindow: f.sw,
		}
		if f.blockSize != nil {
			e.BlockSize = *f.blockSize
		}
		return e, b, nil
	case TagBlockRemoved:
		if !f.haveHashes {
			return nil, b, fmt.Errorf("BlockRemoved map lacks block_hashes")
		}
		e, err := d.newRemoved()
		if err != nil {
			return nil, b, err
		}
		*e = BlockRemoved{BlockHashes: f.hashes, Medium: f.medium, GroupIdx: f.groupIdx}
		return e, b, nil
	case TagAllBlocksCleared:
		return &AllBlocksCleared{}, b, nil
	case TagBlockUpdate:
		if !f.haveHashes {
			return nil, b, fmt.Errorf("BlockUpdate map lacks block_hashes")
		}
		return &BlockUpdate{BlockHashes: f.hashes, Medium: f.medium, ObjectKey: f.objectKey,
			Replicas: f.replicas, GroupIdx: f.groupIdx}, b, nil
	}
	return nil, b, nil
}

func (d *decoder) mapField(f *mapFields, k, b []byte) ([]byte, error) {
	var err error
	switch string(k) {
	case fType:
		f.tag, b, err = readOptString(b)
	case "event_type":
		f.eventType, b, err = readOptString(b)
	case fBlockHashes:
		f.hashes, b, err = d.hashList(b)
		f.haveHashes = true
	case "seq_hashes":
		f.seqHashes, b, err = d.hashList(b)
		f.haveSeq = true
	case fParentBlockHash:
		f.parent, b, err = d.optHash(b)
	case "parent_hash":
		f.parentHash, b, err = d.optHash(b)
	case fTokenIDs:
		if msgp.IsNil(b) {
			b, err = msgp.ReadNilBytes(b)
		} else {
			f.tokens, b, err = d.tokenList(b)
		}
	case fBlockSize:
		f.blockSize, b, err = d.optInt(b)
	case fLoraID:
		f.loraID, b, err = d.optInt(b)
	case fMedium:
		f.medium, b, err = readOptString(b)
	case fLoraName:
		f.loraName, b, err = readOptString(b)
	case fExtraKeys:
		f.extraKeys, b, err = d.readExtraKeys(b)
	case fGroupIdx:
		f.groupIdx, b, err = d.optInt(b)
	case fKVCacheSpecKind:
		f.kind, b, err = readOptString(b)
	case fKVCacheSpecSlidingWindow:
		f.sw, b, err = d.optInt(b)
	case fObjectKey:
		f.objectKey, b, err = readOptString(b)
	case fReplicas:
		f.replicas, b, err = d.readReplicas(b)
	case "event_id":
		var v uint64
		if msgp.IsNil(b) {
			b, err = msgp.ReadNilBytes(b)
		} else if v, b, err = msgp.ReadUint64Bytes(b); err == nil {
			f.eventID = v
		}
	case "timestamp":
		if msgp.IsNil(b) {
			b, err = msgp.ReadNilBytes(b)
		} else {
			var ts float64
			ts, b, err = readTimestamp(b)
			f.timestampMs = int64(math.Round(ts * 1000))
		}
	case "model_name":
		f.modelName, b, err = readOptString(b)
	case "tenant_id":
		f.tenantID, b, err = readOptString(b)
	case "backend_id":
		f.backendID, b, err = readOptString(b)
	case "additional_salt":
		f.salt, b, err = readOptString(b)
	case "group_id":
		f.groupID, b, err = readOptString(b)
	case "dp_rank":
		f.dpRank, b, err = d.optInt(b)
	default:
		b, err = msgp.Skip(b)
	}
	return b, err
}

func (d *decoder) rfcEvent(f *mapFields) (Event, error) {
	info := &RFCInfo{
		EventID: f.eventID, TimestampMs: f.timestampMs, ModelName: f.modelName,
		TenantID: f.tenantID, BackendID: f.backendID, AdditionalSalt: f.salt,
		GroupID: f.groupID, ObjectKey: f.objectKey, DPRank: f.dpRank,
	}
	hashes := f.seqHashes
	if !f.haveSeq {
		hashes = f.hashes
	}
	if hashes == nil {
		hashes = []Hash{}
	}
	switch f.eventType {
	case "stored":
		e, err := d.newStored()
		if err != nil {
			return nil, err
		}
		*e = BlockStored{BlockHashes: hashes, ParentBlockHash: f.parentHash, TokenIDs: f.tokens,
			Medium: f.medium, LoraName: f.loraName, RFC: info}
		if e.ParentBlockHash == nil {
			e.ParentBlockHash = f.parent
		}
		if f.blockSize != nil {
			e.BlockSize = *f.blockSize
		}
		return e, nil
	case "removed":
		e, err := d.newRemoved()
		if err != nil {
			return nil, err
		}
		*e = BlockRemoved{BlockHashes: hashes, Medium: f.medium, RFC: info}
		return e, nil
	case "cleared":
		return &AllBlocksCleared{RFC: info}, nil
	}
	return nil, nil
}

func (d *decoder) hashList(b []byte) ([]Hash, []byte, error) {
	sz, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, b, err
	}
	n, err := count[Hash](d, sz, b)
	if err != nil {
		return nil, b, err
	}
	hs := d.hashSlab(n)
	for i := range hs {
		if hs[i], b, err = readHash(b); err != nil {
			return nil, b, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return hs, b, nil
}

func (d *decoder) optHash(b []byte) (*Hash, []byte, error) {
	if msgp.IsNil(b) {
		rest, err := msgp.ReadNilBytes(b)
		return nil, rest, err
	}
	h := d.hashSlab(1)
	var err error
	h[0], b, err = readHash(b)
	if err != nil {
		return nil, b, err
	}
	return &h[0], b, nil
}

func readHash(b []byte) (Hash, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.IntType, msgp.UintType:
		v, _, rest, err := readAnyInt(b)
		return Hash{Value: v}, rest, err
	case msgp.BinType:
		raw, rest, err := msgp.ReadBytesZC(b)
		if err != nil {
			return Hash{}, rest, err
		}
		return HashFromBytes(append([]byte{}, raw...)), rest, nil
	case msgp.StrType:
		raw, rest, err := msgp.ReadStringZC(b)
		if err != nil {
			return Hash{}, rest, err
		}
		return HashFromBytes(append([]byte{}, raw...)), rest, nil
	}
	return Hash{}, b, fmt.Errorf("hash is %s", msgp.NextType(b))
}

func (d *decoder) tokenList(b []byte) ([]uint32, []byte, error) {
	sz, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, b, err
	}
	n, err := count[uint32](d, sz, b)
	if err != nil {
		return nil, b, err
	}
	ts := d.tokenSlab(n)
	for i := range ts {
		var v uint64
		if v, b, err = msgp.ReadUint64Bytes(b); err != nil {
			return nil, b, fmt.Errorf("[%d]: %w", i, err)
		}
		if v > math.MaxUint32 {
			return nil, b, fmt.Errorf("[%d]: token id %d exceeds uint32", i, v)
		}
		ts[i] = uint32(v)
	}
	return ts, b, nil
}

// readAnyInt reads any msgpack integer; neg reports a negative value whose
// two's complement is returned.
func readAnyInt(b []byte) (v uint64, neg bool, rest []byte, err error) {
	if len(b) == 0 {
		return 0, false, b, msgp.ErrShortBytes
	}
	lead := b[0]
	switch {
	case lead <= 0x7f, lead >= 0xcc && lead <= 0xcf:
		v, rest, err = msgp.ReadUint64Bytes(b)
		return v, false, rest, err
	case lead >= 0xe0, lead >= 0xd0 && lead <= 0xd3:
		var i int64
		i, rest, err = msgp.ReadInt64Bytes(b)
		return uint64(i), i < 0, rest, err
	}
	return 0, false, b, fmt.Errorf("integer expected, got %s", msgp.NextType(b))
}

func readInt64(b []byte) (int64, []byte, error) {
	v, neg, rest, err := readAnyInt(b)
	if err != nil {
		return 0, rest, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, rest, fmt.Errorf("integer %d overflows int64", v)
	}
	return int64(v), rest, nil
}

func (d *decoder) optInt(b []byte) (*int, []byte, error) {
	if msgp.IsNil(b) {
		rest, err := msgp.ReadNilBytes(b)
		return nil, rest, err
	}
	v, rest, err := readInt64(b)
	if err != nil {
		return nil, rest, err
	}
	return d.intPtr(int(v)), rest, nil
}

// intern returns recurring strings (tags, media, cache kinds) without
// allocating; a switch on string(b) does not copy b.
func intern(b []byte) string {
	switch string(b) {
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "DISK":
		return "DISK"
	case "STORAGE":
		return "STORAGE"
	case "cpu":
		return "cpu"
	case "gpu":
		return "gpu"
	case "disk":
		return "disk"
	case "memory":
		return "memory"
	case "full_attention":
		return "full_attention"
	case "sliding_window":
		return "sliding_window"
	case TagBlockStored:
		return TagBlockStored
	case TagBlockRemoved:
		return TagBlockRemoved
	case TagAllBlocksCleared:
		return TagAllBlocksCleared
	case TagBlockUpdate:
		return TagBlockUpdate
	case "stored":
		return "stored"
	case "removed":
		return "removed"
	case "cleared":
		return "cleared"
	}
	return string(b)
}

func readOptString(b []byte) (string, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.NilType:
		rest, err := msgp.ReadNilBytes(b)
		return "", rest, err
	case msgp.StrType:
		s, rest, err := msgp.ReadStringZC(b)
		if err != nil {
			return "", rest, err
		}
		return intern(s), rest, nil
	case msgp.BinType:
		s, rest, err := msgp.ReadBytesZC(b)
		return string(s), rest, err
	}
	return "", b, fmt.Errorf("string expected, got %s", msgp.NextType(b))
}

func (d *decoder) readExtraKeys(b []byte) ([][]any, []byte, error) {
	if msgp.IsNil(b) {
		rest, err := msgp.ReadNilBytes(b)
		return nil, rest, err
	}
	sz, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, b, err
	}
	n, err := count[[]any](d, sz, b)
	if err != nil {
		return nil, b, err
	}
	out := make([][]any, n)
	for i := range out {
		if msgp.IsNil(b) {
			if b, err = msgp.ReadNilBytes(b); err != nil {
				return nil, b, err
			}
			continue
		}
		var inner uint32
		if inner, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return nil, b, fmt.Errorf("[%d]: %w", i, err)
		}
		m, err := count[any](d, inner, b)
		if err != nil {
			return nil, b, err
		}
		vals := make([]any, m)
		for j := range vals {
			if vals[j], b, err = msgp.ReadIntfBytes(b); err != nil {
				return nil, b, fmt.Errorf("[%d][%d]: %w", i, j, err)
			}
		}
		out[i] = vals
	}
	return out, b, nil
}

func (d *decoder) readReplicas(b []byte) ([]Replica, []byte, error) {
	if msgp.IsNil(b) {
		rest, err := msgp.ReadNilBytes(b)
		return nil, rest, err
	}
	sz, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, b, err
	}
	n, err := count[Replica](d, sz, b)
	if err != nil {
		return nil, b, err
	}
	out := make([]Replica, n)
	for i := range out {
		var pair uint32
		if pair, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return nil, b, fmt.Errorf("[%d]: %w", i, err)
		}
		if pair < 2 {
			return nil, b, fmt.Errorf("[%d]: replica has %d fields, want 2", i, pair)
		}
		if out[i].Medium, b, err = readOptString(b); err != nil {
			return nil, b, err
		}
		if out[i].Endpoint, b, err = readOptString(b); err != nil {
			return nil, b, err
		}
		left := int(pair) - 2
		if err = skipN(&b, left); err != nil {
			return nil, b, err
		}
	}
	return out, b, nil
}
