package store

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/storepb"
)

// Sentinel errors of the client itself (store errors from the master are
// errcode errors).
var (
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("store: client closed")
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("store: invalid configuration")
)

// UUID identifies clients and segments (the reference's pair of u64).
type UUID struct{ Hi, Lo uint64 }

func newUUID() UUID {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("store: crypto/rand failed: " + err.Error()) // never on Linux ≥ 3.17
	}
	return UUID{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

func (u UUID) String() string { return fmt.Sprintf("%016x-%016x", u.Hi, u.Lo) }

func (u UUID) pb() *storepb.UUID { return &storepb.UUID{High: u.Hi, Low: u.Lo} }

// ReplicateConfig says how a Put places its replicas. The zero value is
// the reference's default: one replica, no pins, no preference.
type ReplicateConfig struct {
	// Replicas wanted (0 means 1). Placement is best effort: the master
	// may place fewer, down to MinReplicas, when fewer segments can hold
	// the value; more than its maximum is INVALID_PARAMS. Stats counts
	// the puts stored with fewer (UnderReplicatedPuts).
	Replicas int
	// MinReplicas is the fewest replicas a put may store (0 means 1; more
	// than Replicas is INVALID_PARAMS): a put that cannot place that many
	// fails with NO_AVAILABLE_HANDLE and stores nothing.
	MinReplicas int
	// SoftPin keeps the object out of the first eviction pass for
	// SoftPinTTL (0 = the master's default; more than the master's maximum
	// is refused with INVALID_PARAMS).
	SoftPin    bool
	SoftPinTTL time.Duration
	// HardPin: never evicted; only Remove/RemoveAll delete it.
	HardPin bool
	// Preferred segment names (engine segment names, "host:port") tried
	// first.
	Preferred []string
	// SameNode prefers this client's own segment
	// (prefer_alloc_in_same_node).
	SameNode bool
	// Block is passed on to the master for KV events (Put).
	Block *BlockMeta
	// Blocks is Block for BatchPut: empty, or one per key (another
	// length is INVALID_PARAMS).
	Blocks []*BlockMeta
}

// BlockMeta is the inference engine's view of a stored KV block.
type BlockMeta struct {
	BlockHashes     []uint64
	ParentBlockHash *uint64
	TokenIDs        []uint32
	BlockSize       uint32
	LoraID          *int64
	LoraName        string
}

func (b *BlockMeta) pb() *storepb.BlockMetadata {
	if b == nil {
		return nil
	}
	return &storepb.BlockMetadata{
		BlockHashes: b.BlockHashes, ParentBlockHash: b.ParentBlockHash, TokenIds: b.TokenIDs,
		BlockSize: b.BlockSize, LoraId: b.LoraID, LoraName: b.LoraName,
	}
}

// check refuses configurations that cannot mean anything, before any RPC.
func (rc *ReplicateConfig) check() error {
	switch {
	case rc.Replicas < 0 || rc.Replicas > math.MaxUint32:
		return errcode.New(errcode.InvalidParams, "replica count %d", rc.Replicas)
	case rc.MinReplicas < 0 || rc.MinReplicas > max(rc.Replicas, 1):
		return errcode.New(errcode.InvalidParams, "min replicas %d outside [0, %d] (the replica count)", rc.MinReplicas, max(rc.Replicas, 1))
	case rc.SoftPinTTL < 0:
		return errcode.New(errcode.InvalidParams, "soft pin TTL %v", rc.SoftPinTTL)
	case rc.SoftPinTTL > 0 && !rc.SoftPin:
		return errcode.New(errcode.InvalidParams, "soft pin TTL %v without SoftPin", rc.SoftPinTTL)
	}
	for _, p := range rc.Preferred {
		if p == "" {
			return errcode.New(errcode.InvalidParams, "empty preferred segment name")
		}
	}
	return nil
}

func (rc *ReplicateConfig) pb() *storepb.ReplicateConfig {
	ttl := uint64(0)
	if rc.SoftPinTTL > 0 {
		// Round up: a sub-millisecond TTL must not turn into "default".
		ttl = uint64((rc.SoftPinTTL + time.Millisecond - 1) / time.Millisecond)
	}
	return &storepb.ReplicateConfig{
		ReplicaNum:            uint32(rc.Replicas),
		WithSoftPin:           rc.SoftPin,
		SoftPinTtlMs:          ttl,
		WithHardPin:           rc.HardPin,
		PreferredSegments:     rc.Preferred,
		PreferAllocInSameNode: rc.SameNode,
		MinReplicas:           uint32(rc.MinReplicas),
	}
}

// SegmentInfo describes a segment this client mounted.
type SegmentInfo struct {
	ID       UUID
	Name     string // the engine segment name ("host:port")
	Base     uint64 // virtual address of its first byte
	Size     uint64
	Protocol string
}

// SegmentStatus is the master's view of a segment.
type SegmentStatus struct {
	Status   storepb.SegmentStatus
	Name     string
	Capacity uint64
	Used     uint64
}
