package event

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Errors returned by this package. Wrapped errors keep these as their cause,
// so callers test with errors.Is.
var (
	// ErrMalformed reports a payload or frame that is not a valid event
	// stream message (bad msgpack, wrong shape, wrong type).
	ErrMalformed = errors.New("event: malformed message")
	// ErrUnencodable reports an event that cannot be encoded (nil event,
	// unsupported value in ExtraKeys, unknown encoding).
	ErrUnencodable = errors.New("event: cannot encode")
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("event: publisher closed")
	// ErrConfig reports an invalid PublisherConfig or SubscriberConfig.
	ErrConfig = errors.New("event: invalid config")
	// ErrEndpoint reports an endpoint string that cannot be used.
	ErrEndpoint = errors.New("event: invalid endpoint")
	// ErrReplay reports a failed replay request (no reply, bad reply).
	ErrReplay = errors.New("event: replay failed")
)

// Kind identifies an event type. Its String is the msgspec tag used on the
// wire.
type Kind uint8

// Event kinds.
const (
	KindBlockStored Kind = iota + 1
	KindBlockRemoved
	KindAllBlocksCleared
	KindBlockUpdate
)

// Wire tags (msgspec's class names).
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
	TagBlockUpdate      = "BlockUpdate"
)

func (k Kind) String() string {
	switch k {
	case KindBlockStored:
		return TagBlockStored
	case KindBlockRemoved:
		return TagBlockRemoved
	case KindAllBlocksCleared:
		return TagAllBlocksCleared
	case KindBlockUpdate:
		return TagBlockUpdate
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is one KV cache event. The set is closed: *BlockStored,
// *BlockRemoved, *AllBlocksCleared and *BlockUpdate.
type Event interface {
	Kind() Kind
	isEvent()
}

// Hash is a block hash. vLLM sends either an unsigned 64-bit integer or raw
// bytes (newer hashing). Bytes, when non-nil, are what goes on the wire (as
// msgpack bin); Value then holds their last 8 bytes big-endian (left-padded
// with zeros when shorter), the form indexers key on. A negative integer
// hash from an old producer decodes to its two's complement.
type Hash struct {
	Value uint64
	Bytes []byte
}

// HashOf returns an integer hash.
func HashOf(v uint64) Hash { return Hash{Value: v} }

// HashFromBytes returns a bytes hash; Value is derived from b as described on
// Hash. b is retained.
func HashFromBytes(b []byte) Hash {
	if b == nil {
		b = []byte{}
	}
	return Hash{Value: lastUint64(b), Bytes: b}
}

func lastUint64(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var pad [8]byte
	copy(pad[8-len(b):], b)
	return binary.BigEndian.Uint64(pad[:])
}

// Ptr returns a pointer to v; a convenience for the optional fields.
func Ptr[T any](v T) *T { return &v }

// BlockStored announces blocks that became available. Field order and
// meaning follow vLLM's BlockStored. Strings encode as nil (Python None)
// when empty; pointer fields as nil when nil.
type BlockStored struct {
	BlockHashes     []Hash
	ParentBlockHash *Hash
	TokenIDs        []uint32
	BlockSize       int
	LoraID          *int // deprecated upstream, kept for compatibility
	Medium          string
	LoraName        string
	// ExtraKeys has one entry per block: nil (None) or a tuple of values
	// (nil, bool, integers, floats, string, []byte, []any, map[string]any,
	// msgp.Raw). A nil ExtraKeys is omitted (map) or nil (array).
	ExtraKeys                [][]any
	GroupIdx                 *int
	KVCacheSpecKind          string
	KVCacheSpecSlidingWindow *int

	// RFC carries the envelope of a Mooncake RFC #1527 event; set only by
	// the decoder, never encoded.
	RFC *RFCInfo
}

// BlockRemoved announces blocks that are gone from Medium.
type BlockRemoved struct {
	BlockHashes []Hash
	Medium      string
	GroupIdx    *int

	RFC *RFCInfo // decode only, see BlockStored.RFC
}

// AllBlocksCleared announces that every block was dropped.
type AllBlocksCleared struct {
	RFC *RFCInfo // decode only, see BlockStored.RFC
}

// BlockUpdate is Crescent's extension: the placement of already stored
// blocks changed (replica added, moved or lost on some medium). vLLM-only
// consumers do not know its tag, so the Publisher never puts it in a batch
// with other events (see the package doc).
type BlockUpdate struct {
	BlockHashes []Hash
	Medium      string    // the primary medium after the change
	ObjectKey   string    // store key of the blocks, when known
	Replicas    []Replica // every replica after the change
	GroupIdx    *int
}

// Replica is one copy of a block: where it lives and how to reach it.
type Replica struct {
	Medium   string
	Endpoint string
}

// RFCInfo is the envelope of a Mooncake RFC #1527 map event.
type RFCInfo struct {
	EventID        uint64
	TimestampMs    int64
	ModelName      string
	TenantID       string
	BackendID      string
	AdditionalSalt string
	GroupID        string
	ObjectKey      string
	DPRank         *int
}

func (*BlockStored) Kind() Kind      { return KindBlockStored }
func (*BlockRemoved) Kind() Kind     { return KindBlockRemoved }
func (*AllBlocksCleared) Kind() Kind { return KindAllBlocksCleared }
func (*BlockUpdate) Kind() Kind      { return KindBlockUpdate }

func (*BlockStored) isEvent()      {}
func (*BlockRemoved) isEvent()     {}
func (*AllBlocksCleared) isEvent() {}
func (*BlockUpdate) isEvent()      {}

// EventBatch is one published message: vLLM's EventBatch.
type EventBatch struct {
	// Timestamp in seconds since the Unix epoch (a Mooncake integer
	// timestamp in milliseconds is converted on decode).
	Timestamp        float64
	Events           []Event
	DataParallelRank *int

	// Skipped counts events the decoder skipped because their tag is
	// unknown. Never encoded.
	Skipped int
}

// Encoding selects how events are laid out inside a batch.
type Encoding uint8

const (
	// EncodingMap encodes each event as a msgpack map tagged under "type"
	// with default-valued optional fields omitted, as vLLM >= 0.26 does
	// (msgspec tag=True, omit_defaults=True, not array_like).
	EncodingMap Encoding = iota
	// EncodingArray encodes each event as a tag-first array of all its
	// fields, as older vLLM does (msgspec array_like=True, which never
	// omits fields).
	EncodingArray
)

func (e Encoding) String() string {
	switch e {
	case EncodingMap:
		return "map"
	case EncodingArray:
		return "array"
	}
	return fmt.Sprintf("Encoding(%d)", uint8(e))
}

// ParseEncoding accepts "map" or "array" (the flag spelling).
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "map", "":
		return EncodingMap, nil
	case "array", "legacy":
		return EncodingArray, nil
	}
	return 0, fmt.Errorf("%w: unknown encoding %q (want map or array)", ErrConfig, s)
}
