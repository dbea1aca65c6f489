package oplog

import (
	"errors"
	"fmt"
	"time"

	"github.com/crescent-kv/crescent/ha/internal/msgpfields"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/master"
)

//go:generate msgp -tests=false -io=false -unexported

// Limits on an op payload's lists, checked when encoding and (by the
// generated decoder, before allocating) when decoding.
const (
	MaxOpReplicas = 255     // Segments, Addrs: master.Config.MaxReplicas is at most 255
	MaxOpHashes   = 1 << 16 // Block.BlockHashes
	MaxOpTokens   = 1 << 20 // Block.TokenIDs
)

// ErrBadOp is returned for an op or an entry that is not a valid op
// record: an unknown kind, an unknown field, a list over its limit, a
// malformed payload.
var ErrBadOp = errors.New("oplog: bad op record")

// maxKind is the last master.OpKind this codec knows; TestOpKindsKnown
// fails when master gains one, so that it is added here and in doc.go.
const maxKind = master.OpClientLeft

// opRecord is an op's payload: every master.Op field but Kind, Time and
// Key, which the Entry carries. Tags are the persisted format: never
// rename or reuse one; a new field gets a new tag and decodes as its zero
// value from entries written before it existed.
type opRecord struct {
	ClientHi   uint64         `msg:"c_hi,omitempty"`
	ClientLo   uint64         `msg:"c_lo,omitempty"`
	Size       uint64         `msg:"size,omitempty"`
	SoftPin    bool           `msg:"soft,omitempty"`
	SoftPinTTL int64          `msg:"soft_ttl,omitempty"` // ns
	HardPin    bool           `msg:"hard,omitempty"`
	Segments   []uint32       `msg:"segs,omitempty,limit=255"`
	Addrs      []uint64       `msg:"addrs,omitempty,limit=255"`
	Segment    *segmentRecord `msg:"segment,omitempty"`
	Block      *blockRecord   `msg:"block,omitempty"`
	ID         uint64         `msg:"id,omitempty"`
	Gen        uint64         `msg:"gen,omitempty"`
	HoldUntil  int64          `msg:"hold,omitempty"`
}

// segmentRecord is an alloc.Segment.
type segmentRecord struct {
	IDHi       uint64 `msg:"id_hi,omitempty"`
	IDLo       uint64 `msg:"id_lo,omitempty"`
	Name       string `msg:"name,omitempty"`
	Base       uint64 `msg:"base,omitempty"`
	Size       uint64 `msg:"size,omitempty"`
	ClientHi   uint64 `msg:"c_hi,omitempty"`
	ClientLo   uint64 `msg:"c_lo,omitempty"`
	Protocol   string `msg:"proto,omitempty"`
	TEEndpoint string `msg:"te,omitempty"`
}

// blockRecord is a master.BlockMeta.
type blockRecord struct {
	BlockHashes []uint64 `msg:"hashes,omitempty,limit=65536"`
	HasParent   bool     `msg:"has_parent,omitempty"`
	ParentHash  uint64   `msg:"parent,omitempty"`
	TokenIDs    []uint32 `msg:"tokens,omitempty,limit=1048576"`
	BlockSize   uint32   `msg:"block_size,omitempty"`
	HasLora     bool     `msg:"has_lora,omitempty"`
	LoraID      int64    `msg:"lora_id,omitempty"`
	LoraName    string   `msg:"lora_name,omitempty"`
}

// The field names each record may hold; anything else is ErrBadOp (an
// entry from a newer writer: refusing it beats replaying half an op).
var (
	opFields      = msgpfields.Of("c_hi", "c_lo", "size", "soft", "soft_ttl", "hard", "segs", "addrs", "segment", "block", "id", "gen", "hold")
	segmentFields = msgpfields.Of("id_hi", "id_lo", "name", "base", "size", "c_hi", "c_lo", "proto", "te")
	blockFields   = msgpfields.Of("hashes", "has_parent", "parent", "tokens", "block_size", "has_lora", "lora_id", "lora_name")
)

func knownKind(k master.OpKind) bool { return k >= master.OpPutStart && k <= maxKind }

// EncodeOp maps op to an entry's kind, key and payload. The entry's Time
// is op.Time.
func EncodeOp(op *master.Op) (kind uint8, key string, payload []byte, err error) {
	switch {
	case op == nil:
		return 0, "", nil, fmt.Errorf("%w: nil op", ErrBadOp)
	case !knownKind(op.Kind):
		return 0, "", nil, fmt.Errorf("%w: unknown kind %v", ErrBadOp, op.Kind)
	case len(op.Key) > MaxKey:
		return 0, "", nil, fmt.Errorf("%w: %v key of %d bytes (max %d)", ErrTooLarge, op.Kind, len(op.Key), MaxKey)
	case len(op.Segments) > MaxOpReplicas || len(op.Addrs) > MaxOpReplicas:
		return 0, "", nil, fmt.Errorf("%w: %v %q: %d segments, %d addresses (max %d)", ErrTooLarge, op.Kind, op.Key,
			len(op.Segments), len(op.Addrs), MaxOpReplicas)
	case op.Block != nil && (len(op.Block.BlockHashes) > MaxOpHashes || len(op.Block.TokenIDs) > MaxOpTokens):
		return 0, "", nil, fmt.Errorf("%w: %v %q: %d block hashes (max %d), %d tokens (max %d)", ErrTooLarge, op.Kind, op.Key,
			len(op.Block.BlockHashes), MaxOpHashes, len(op.Block.TokenIDs), MaxOpTokens)
	}
	r := opRecord{
		ClientHi: op.Client.Hi, ClientLo: op.Client.Lo,
		Size: op.Size, SoftPin: op.SoftPin, SoftPinTTL: int64(op.SoftPinTTL), HardPin: op.HardPin,
		Segments: op.Segments, Addrs: op.Addrs, ID: op.ID, Gen: op.Gen, HoldUntil: op.HoldUntil,
	}
	if s := op.Segment; s != nil {
		r.Segment = &segmentRecord{IDHi: s.ID.Hi, IDLo: s.ID.Lo, Name: s.Name, Base: s.Base, Size: s.Size,
			ClientHi: s.Client.Hi, ClientLo: s.Client.Lo, Protocol: s.Protocol, TEEndpoint: s.TEEndpoint}
	}
	if b := op.Block; b != nil {
		r.Block = &blockRecord{BlockHashes: b.BlockHashes, HasParent: b.HasParent, ParentHash: b.ParentHash,
			TokenIDs: b.TokenIDs, BlockSize: b.BlockSize, HasLora: b.HasLora, LoraID: b.LoraID, LoraName: b.LoraName}
	}
	payload, err = r.MarshalMsg(make([]byte, 0, r.Msgsize()))
	if err != nil {
		return 0, "", nil, fmt.Errorf("%w: %v %q: %v", ErrBadOp, op.Kind, op.Key, err)
	}
	if len(payload) > MaxPayload {
		return 0, "", nil, fmt.Errorf("%w: %v %q: payload of %d bytes (max %d)", ErrTooLarge, op.Kind, op.Key, len(payload), MaxPayload)
	}
	return uint8(op.Kind), op.Key, payload, nil
}

// FromOp is EncodeOp as an Entry (Seq, Term and CRC left for the caller).
func FromOp(op *master.Op) (Entry, error) {
	kind, key, payload, err := EncodeOp(op)
	if err != nil {
		return Entry{}, err
	}
	return Entry{Time: op.Time, Kind: kind, Key: key, Payload: payload}, nil
}

// DecodeOp maps an entry back to the op it was made from. It does not
// check the entry's checksum (Verify does); it checks its limits.
func DecodeOp(e *Entry) (*master.Op, error) {
	if e == nil {
		return nil, fmt.Errorf("%w: nil entry", ErrBadOp)
	}
	k := master.OpKind(e.Kind)
	if !knownKind(k) {
		return nil, fmt.Errorf("%w: seq %d: unknown kind %d", ErrBadOp, e.Seq, e.Kind)
	}
	if len(e.Key) > MaxKey || len(e.Payload) > MaxPayload {
		return nil, fmt.Errorf("%w: seq %d: key %d bytes, payload %d bytes", ErrTooLarge, e.Seq, len(e.Key), len(e.Payload))
	}
	if err := checkFields(e.Payload); err != nil {
		return nil, fmt.Errorf("%w: seq %d (%v): %v", ErrBadOp, e.Seq, k, err)
	}
	var r opRecord
	rest, err := r.UnmarshalMsg(e.Payload)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d bytes after the record", len(rest))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: seq %d (%v): %v", ErrBadOp, e.Seq, k, err)
	}
	op := &master.Op{
		Kind: k, Time: e.Time, Key: e.Key,
		Client: master.UUID{Hi: r.ClientHi, Lo: r.ClientLo},
		Size:   r.Size, SoftPin: r.SoftPin, SoftPinTTL: time.Duration(r.SoftPinTTL), HardPin: r.HardPin,
		Segments: r.Segments, Addrs: r.Addrs, ID: r.ID, Gen: r.Gen, HoldUntil: r.HoldUntil,
	}
	if s := r.Segment; s != nil {
		op.Segment = &alloc.Segment{ID: alloc.UUID{Hi: s.IDHi, Lo: s.IDLo}, Name: s.Name, Base: s.Base, Size: s.Size,
			Client: alloc.UUID{Hi: s.ClientHi, Lo: s.ClientLo}, Protocol: s.Protocol, TEEndpoint: s.TEEndpoint}
	}
	if b := r.Block; b != nil {
		op.Block = &master.BlockMeta{BlockHashes: b.BlockHashes, HasParent: b.HasParent, ParentHash: b.ParentHash,
			TokenIDs: b.TokenIDs, BlockSize: b.BlockSize, HasLora: b.HasLora, LoraID: b.LoraID, LoraName: b.LoraName}
	}
	return op, nil
}

// ToOp is DecodeOp.
func ToOp(e *Entry) (*master.Op, error) { return DecodeOp(e) }

// checkFields refuses a payload holding a field this codec does not know
// (the generated decoder would skip it).
func checkFields(b []byte) error {
	return msgpfields.Walk(b, opFields, func(name string, v []byte) error {
		switch name {
		case "segment":
			return msgpfields.WalkNested(v, segmentFields)
		case "block":
			return msgpfields.WalkNested(v, blockFields)
		}
		return nil
	})
}
