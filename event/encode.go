package event

import (
	"fmt"
	"math"
	"slices"

	"github.com/tinylib/msgp/msgp"
)

// Field names on the wire (map encoding), in msgspec declaration order.
const (
	fType                     = "type"
	fBlockHashes              = "block_hashes"
	fParentBlockHash          = "parent_block_hash"
	fTokenIDs                 = "token_ids"
	fBlockSize                = "block_size"
	fLoraID                   = "lora_id"
	fMedium                   = "medium"
	fLoraName                 = "lora_name"
	fExtraKeys                = "extra_keys"
	fGroupIdx                 = "group_idx"
	fKVCacheSpecKind          = "kv_cache_spec_kind"
	fKVCacheSpecSlidingWindow = "kv_cache_spec_sliding_window"
	fObjectKey                = "object_key"
	fReplicas                 = "replicas"
)

// EncodeBatch returns the msgpack payload of b. See AppendBatch.
func EncodeBatch(b *EventBatch, enc Encoding) ([]byte, error) {
	return AppendBatch(nil, b, enc)
}

// AppendBatch appends the msgpack payload of b to dst: the array
// [timestamp, [events...], data_parallel_rank|nil], byte-identical to what
// vLLM's msgspec encoder writes for the same values. On error dst is
// returned unchanged (truncated to its original length).
func AppendBatch(dst []byte, b *EventBatch, enc Encoding) ([]byte, error) {
	if b == nil {
		return dst, fmt.Errorf("%w: nil batch", ErrUnencodable)
	}
	if enc != EncodingMap && enc != EncodingArray {
		return dst, fmt.Errorf("%w: unknown encoding %d", ErrUnencodable, enc)
	}
	if uint64(len(b.Events)) > math.MaxUint32 {
		return dst, fmt.Errorf("%w: too many events", ErrUnencodable)
	}
	start := len(dst)
	out := msgp.AppendArrayHeader(dst, 3)
	out = msgp.AppendFloat64(out, b.Timestamp)
	out = msgp.AppendArrayHeader(out, uint32(len(b.Events)))
	var err error
	for i, ev := range b.Events {
		if out, err = appendEvent(out, ev, enc); err != nil {
			return dst[:start], fmt.Errorf("event %d: %w", i, err)
		}
	}
	out = appendOptInt(out, b.DataParallelRank)
	return out, nil
}

// AppendEvent appends one event's msgpack encoding to dst.
func AppendEvent(dst []byte, ev Event, enc Encoding) ([]byte, error) {
	if enc != EncodingMap && enc != EncodingArray {
		return dst, fmt.Errorf("%w: unknown encoding %d", ErrUnencodable, enc)
	}
	start := len(dst)
	out, err := appendEvent(dst, ev, enc)
	if err != nil {
		return dst[:start], err
	}
	return out, nil
}

func appendEvent(b []byte, ev Event, enc Encoding) ([]byte, error) {
	switch e := ev.(type) {
	case *BlockStored:
		if e != nil {
			return appendBlockStored(b, e, enc)
		}
	case *BlockRemoved:
		if e != nil {
			return appendBlockRemoved(b, e, enc), nil
		}
	case *AllBlocksCleared:
		if e != nil {
			if enc == EncodingArray {
				b = msgp.AppendArrayHeader(b, 1)
				return msgp.AppendString(b, TagAllBlocksCleared), nil
			}
			b = msgp.AppendMapHeader(b, 1)
			b = msgp.AppendString(b, fType)
			return msgp.AppendString(b, TagAllBlocksCleared), nil
		}
	case *BlockUpdate:
		if e != nil {
			return appendBlockUpdate(b, e, enc), nil
		}
	}
	return b, fmt.Errorf("%w: nil or unknown event %T", ErrUnencodable, ev)
}

// appendBlockStored follows msgspec: array_like writes the tag then every
// field; the map form writes the tag, the 7 fields without defaults, then
// each defaulted field only when it differs from its default (None).
func appendBlockStored(b []byte, e *BlockStored, enc Encoding) ([]byte, error) {
	var err error
	if enc == EncodingArray {
		b = msgp.AppendArrayHeader(b, 12)
		b = msgp.AppendString(b, TagBlockStored)
		b = appendHashes(b, e.BlockHashes)
		b = appendOptHash(b, e.ParentBlockHash)
		b = appendTokens(b, e.TokenIDs)
		b = appendInt(b, int64(e.BlockSize))
		b = appendOptInt(b, e.LoraID)
		b = appendOptString(b, e.Medium)
		b = appendOptString(b, e.LoraName)
		if b, err = appendExtraKeys(b, e.ExtraKeys); err != nil {
			return b, err
		}
		b = appendOptInt(b, e.GroupIdx)
		b = appendOptString(b, e.KVCacheSpecKind)
		return appendOptInt(b, e.KVCacheSpecSlidingWindow), nil
	}
	n := uint32(8)
	if e.ExtraKeys != nil {
		n++
	}
	if e.GroupIdx != nil {
		n++
	}
	if e.KVCacheSpecKind != "" {
		n++
	}
	if e.KVCacheSpecSlidingWindow != nil {
		n++
	}
	b = msgp.AppendMapHeader(b, n)
	b = appendKey(b, fType)
	b = msgp.AppendString(b, TagBlockStored)
	b = appendKey(b, fBlockHashes)
	b = appendHashes(b, e.BlockHashes)
	b = appendKey(b, fParentBlockHash)
	b = appendOptHash(b, e.ParentBlockHash)
	b = appendKey(b, fTokenIDs)
	b = appendTokens(b, e.TokenIDs)
	b = appendKey(b, fBlockSize)
	b = appendInt(b, int64(e.BlockSize))
	b = appendKey(b, fLoraID)
	b = appendOptInt(b, e.LoraID)
	b = appendKey(b, fMedium)
	b = appendOptString(b, e.Medium)
	b = appendKey(b, fLoraName)
	b = appendOptString(b, e.LoraName)
	if e.ExtraKeys != nil {
		b = appendKey(b, fExtraKeys)
		if b, err = appendExtraKeys(b, e.ExtraKeys); err != nil {
			return b, err
		}
	}
	if e.GroupIdx != nil {
		b = appendKey(b, fGroupIdx)
		b = appendInt(b, int64(*e.GroupIdx))
	}
	if e.KVCacheSpecKind != "" {
		b = appendKey(b, fKVCacheSpecKind)
		b = msgp.AppendString(b, e.KVCacheSpecKind)
	}
	if e.KVCacheSpecSlidingWindow != nil {
		b = appendKey(b, fKVCacheSpecSlidingWindow)
		b = appendInt(b, int64(*e.KVCacheSpecSlidingWindow))
	}
	return b, nil
}

func appendBlockRemoved(b []byte, e *BlockRemoved, enc Encoding) []byte {
	if enc == EncodingArray {
		b = msgp.AppendArrayHeader(b, 4)
		b = msgp.AppendString(b, TagBlockRemoved)
		b = appendHashes(b, e.BlockHashes)
		b = appendOptString(b, e.Medium)
		return appendOptInt(b, e.GroupIdx)
	}
	n := uint32(3)
	if e.GroupIdx != nil {
		n++
	}
	b = msgp.AppendMapHeader(b, n)
	b = appendKey(b, fType)
	b = msgp.AppendString(b, TagBlockRemoved)
	b = appendKey(b, fBlockHashes)
	b = appendHashes(b, e.BlockHashes)
	b = appendKey(b, fMedium)
	b = appendOptString(b, e.Medium)
	if e.GroupIdx != nil {
		b = appendKey(b, fGroupIdx)
		b = appendInt(b, int64(*e.GroupIdx))
	}
	return b
}

// BlockUpdate is laid out as the msgspec struct
//
//	class BlockUpdate(KVCacheEvent):
//	    block_hashes: list[int | bytes]
//	    medium: str | None
//	    object_key: str | None = None
//	    replicas: list[tuple[str, str]] | None = None
//	    group_idx: int | None = None
func appendBlockUpdate(b []byte, e *BlockUpdate, enc Encoding) []byte {
	if enc == EncodingArray {
		b = msgp.AppendArrayHeader(b, 6)
		b = msgp.AppendString(b, TagBlockUpdate)
		b = appendHashes(b, e.BlockHashes)
		b = appendOptString(b, e.Medium)
		b = appendOptString(b, e.ObjectKey)
		b = appendReplicas(b, e.Replicas)
		return appendOptInt(b, e.GroupIdx)
	}
	n := uint32(3)
	if e.ObjectKey != "" {
		n++
	}
	if e.Replicas != nil {
		n++
	}
	if e.GroupIdx != nil {
		n++
	}
	b = msgp.AppendMapHeader(b, n)
	b = appendKey(b, fType)
	b = msgp.AppendString(b, TagBlockUpdate)
	b = appendKey(b, fBlockHashes)
	b = appendHashes(b, e.BlockHashes)
	b = appendKey(b, fMedium)
	b = appendOptString(b, e.Medium)
	if e.ObjectKey != "" {
		b = appendKey(b, fObjectKey)
		b = msgp.AppendString(b, e.ObjectKey)
	}
	if e.Replicas != nil {
		b = appendKey(b, fReplicas)
		b = appendReplicas(b, e.Replicas)
	}
	if e.GroupIdx != nil {
		b = appendKey(b, fGroupIdx)
		b = appendInt(b, int64(*e.GroupIdx))
	}
	return b
}

func appendReplicas(b []byte, rs []Replica) []byte {
	if rs == nil {
		return msgp.AppendNil(b)
	}
	b = msgp.AppendArrayHeader(b, uint32(len(rs)))
	for _, r := range rs {
		b = msgp.AppendArrayHeader(b, 2)
		b = msgp.AppendString(b, r.Medium)
		b = msgp.AppendString(b, r.Endpoint)
	}
	return b
}

func appendKey(b []byte, k string) []byte { return msgp.AppendString(b, k) }

// appendInt writes an integer the way msgspec does: unsigned formats for
// non-negative values, signed formats only for negative ones.
func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(b, uint64(v))
	}
	return msgp.AppendInt64(b, v)
}

func appendOptInt(b []byte, v *int) []byte {
	if v == nil {
		return msgp.AppendNil(b)
	}
	return appendInt(b, int64(*v))
}

func appendOptString(b []byte, s string) []byte {
	if s == "" {
		return msgp.AppendNil(b)
	}
	return msgp.AppendString(b, s)
}

func appendHash(b []byte, h Hash) []byte {
	if h.Bytes != nil {
		return msgp.AppendBytes(b, h.Bytes)
	}
	return msgp.AppendUint64(b, h.Value)
}

func appendOptHash(b []byte, h *Hash) []byte {
	if h == nil {
		return msgp.AppendNil(b)
	}
	return appendHash(b, *h)
}

func appendHashes(b []byte, hs []Hash) []byte {
	b = msgp.AppendArrayHeader(b, uint32(len(hs)))
	for _, h := range hs {
		b = appendHash(b, h)
	}
	return b
}

func appendTokens(b []byte, ts []uint32) []byte {
	b = msgp.AppendArrayHeader(b, uint32(len(ts)))
	for _, t := range ts {
		b = msgp.AppendUint64(b, uint64(t))
	}
	return b
}

func appendExtraKeys(b []byte, ks [][]any) ([]byte, error) {
	if ks == nil {
		return msgp.AppendNil(b), nil
	}
	b = msgp.AppendArrayHeader(b, uint32(len(ks)))
	var err error
	for i, k := range ks {
		if k == nil {
			b = msgp.AppendNil(b)
			continue
		}
		b = msgp.AppendArrayHeader(b, uint32(len(k)))
		for j, v := range k {
			if b, err = appendValue(b, v, 0); err != nil {
				return b, fmt.Errorf("extra_keys[%d][%d]: %w", i, j, err)
			}
		}
	}
	return b, nil
}

const maxValueDepth = 32

// appendValue encodes a generic value as msgspec encodes the equivalent
// Python value: ints by the unsigned-first rule, floats as float64, maps in
// sorted key order (Go maps have no order; Python dicts keep insertion
// order, so a producer that needs another order passes msgp.Raw).
func appendValue(b []byte, v any, depth int) ([]byte, error) {
	if depth > maxValueDepth {
		return b, fmt.Errorf("%w: value nested deeper than %d", ErrUnencodable, maxValueDepth)
	}
	switch x := v.(type) {
	case nil:
		return msgp.AppendNil(b), nil
	case bool:
		return msgp.AppendBool(b, x), nil
	case int:
		return appendInt(b, int64(x)), nil
	case int8:
		return appendInt(b, int64(x)), nil
	case int16:
		return appendInt(b, int64(x)), nil
	case int32:
		return appendInt(b, int64(x)), nil
	case int64:
		return appendInt(b, x), nil
	case uint:
		return msgp.AppendUint64(b, uint64(x)), nil
	case uint8:
		return msgp.AppendUint64(b, uint64(x)), nil
	case uint16:
		return msgp.AppendUint64(b, uint64(x)), nil
	case uint32:
		return msgp.AppendUint64(b, uint64(x)), nil
	case uint64:
		return msgp.AppendUint64(b, x), nil
	case float32:
		return msgp.AppendFloat64(b, float64(x)), nil
	case float64:
		return msgp.AppendFloat64(b, x), nil
	case string:
		return msgp.AppendString(b, x), nil
	case []byte:
		return msgp.AppendBytes(b, x), nil
	case msgp.Raw:
		if len(x) == 0 {
			return b, fmt.Errorf("%w: empty msgp.Raw", ErrUnencodable)
		}
		return append(b, x...), nil
	case []any:
		b = msgp.AppendArrayHeader(b, uint32(len(x)))
		var err error
		for _, e := range x {
			if b, err = appendValue(b, e, depth+1); err != nil {
				return b, err
			}
		}
		return b, nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = msgp.AppendMapHeader(b, uint32(len(x)))
		var err error
		for _, k := range keys {
			b = msgp.AppendString(b, k)
			if b, err = appendValue(b, x[k], depth+1); err != nil {
				return b, err
			}
		}
		return b, nil
	}
	return b, fmt.Errorf("%w: unsupported value type %T", ErrUnencodable, v)
}
