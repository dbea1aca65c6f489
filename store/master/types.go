package master

import (
	"strconv"
	"time"

	"github.com/crescent-kv/crescent/store/alloc"
)

// UUID identifies clients and segments.
type UUID = alloc.UUID

// ReplicaType is where a replica lives (values as storepb.ReplicaType).
type ReplicaType uint8

// Replica types. The master places MEMORY replicas only.
const (
	Memory ReplicaType = iota
	Disk
	LocalDisk
)

// ReplicaStatus is a replica's state (values as storepb.ReplicaStatus).
type ReplicaStatus uint8

// Replica states used by the master: PROCESSING between PutStart and
// PutEnd, COMPLETE after.
const (
	StatusUndefined ReplicaStatus = iota
	StatusInitialized
	StatusProcessing
	StatusComplete
	StatusRemoved
	StatusFailed
)

// ClientStatus is Ping's answer (values as storepb.ClientStatus).
type ClientStatus uint8

// Client states.
const (
	ClientUndefined ClientStatus = iota
	ClientOK
	ClientNeedRemount
)

// SegmentStatus is QuerySegmentStatus's answer (values as
// storepb.SegmentStatus).
type SegmentStatus uint8

// Segment states.
const (
	SegmentUndefined SegmentStatus = iota
	SegmentOK
	SegmentUnmounting
)

// ReplicateConfig says how a Put is placed. The zero value is one replica,
// no pins, no preference.
type ReplicateConfig struct {
	Replicas   int           // 0 means 1; placement is best effort
	SoftPin    bool          // out of the first eviction pass while the pin lasts
	SoftPinTTL time.Duration // 0 = Config.SoftPinTTL; above Config.MaxSoftPinTTL is invalid
	HardPin    bool          // never evicted
	Preferred  []string      // segment names tried first
	SameNode   bool          // the calling client's own segments first
	// MinReplicas is the fewest replicas a put may store (0 means 1;
	// above Replicas is invalid): placing fewer is ErrNoAvailableHandle.
	MinReplicas int
}

// Replica locates one copy of an object: bytes [Addr, Addr+Size) of the
// engine segment SegmentName.
type Replica struct {
	Type        ReplicaType
	Status      ReplicaStatus
	SegmentName string
	SegmentID   UUID
	Addr        uint64
	Size        uint64
	Protocol    string
}

// BlockMeta is the inference engine's description of a stored KV block,
// passed through to KV events.
type BlockMeta struct {
	BlockHashes []uint64
	HasParent   bool
	ParentHash  uint64
	TokenIDs    []uint32
	BlockSize   uint32
	HasLora     bool
	LoraID      int64
	LoraName    string
}

// KeyInfo is QueryKey's answer.
type KeyInfo struct {
	Key             string
	Size            uint64
	Complete        bool
	Replicas        []Replica
	Leased          bool      // a lease is in force now
	LeaseDeadline   time.Time // zero when never leased
	SoftPin         bool
	SoftPinDeadline time.Time // zero while the put is unfinished
	HardPin         bool
	Owner           UUID      // the writing client, while unfinished
	Started         time.Time // PutStart time, while unfinished
}

// SegmentInfo describes a mounted segment.
type SegmentInfo struct {
	alloc.Segment
	Index       uint32
	Status      SegmentStatus
	Capacity    uint64
	Used        uint64
	Allocs      int
	LargestFree uint64
	// Suspect: a client reported failed writes to it (ReportFailedSegments);
	// new replicas avoid it until its owner pings again.
	Suspect bool
}

// Stats is a snapshot of the master's counters, for metrics.
type Stats struct {
	Capacity       uint64 // bytes of all mounted segments
	Allocated      uint64 // bytes reserved (rounded) on them
	Keys           int64  // objects, finished or not
	PendingKeys    int64  // objects between PutStart and PutEnd
	SoftPinnedKeys int64
	HardPinnedKeys int64
	Segments       int
	ActiveClients  int    // clients with mounted segments being tracked
	Quarantined    int64  // replicas of taken-over puts waiting for PutReleaseTimeout
	Reservations   int    // space placed ahead of puts (ReservePut), not yet committed
	ReservedBytes  uint64 // their size (one replica's worth each)
	// SuspectSegments are avoided by placement (failed writes reported)
	// until their owners ping again.
	SuspectSegments int

	EvictionRuns    uint64
	EvictedKeys     uint64
	EvictedBytes    uint64
	ExpiredClients  uint64 // clients dropped for missing heartbeats
	DiscardedPuts   uint64 // unfinished puts taken over
	ReleasedPuts    uint64 // unfinished puts freed at PutReleaseTimeout
	DroppedReplicas uint64 // replicas lost with their segment (client expiry)
	LostKeys        uint64 // objects erased because no replica was left (client expiry)

	// A clean UnmountSegment (a client's Close) is not a loss.
	DepartedClients   uint64 // clients that unmounted their last segment
	UnmountedReplicas uint64 // replicas dropped with a segment its client unmounted
	UnmountedKeys     uint64 // objects erased because their last replica's segment was unmounted
	SegmentReports    uint64 // segments reported by clients whose writes to them failed
}

// EvictResult reports one eviction round.
type EvictResult struct {
	Target uint64 // bytes the round aimed to free
	Keys   int
	Bytes  uint64 // bytes freed (reserved, all replicas)
	Pass2  bool   // soft-pinned objects were considered
}

func enumName(names []string, v uint8, kind string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return kind + "(" + strconv.Itoa(int(v)) + ")"
}

func (t ReplicaType) String() string {
	return enumName([]string{"MEMORY", "DISK", "LOCAL_DISK"}, uint8(t), "ReplicaType")
}

func (s ReplicaStatus) String() string {
	return enumName([]string{"UNDEFINED", "INITIALIZED", "PROCESSING", "COMPLETE", "REMOVED", "FAILED"}, uint8(s), "ReplicaStatus")
}

func (s ClientStatus) String() string {
	return enumName([]string{"UNDEFINED", "OK", "NEED_REMOUNT"}, uint8(s), "ClientStatus")
}

func (s SegmentStatus) String() string {
	return enumName([]string{"UNDEFINED", "OK", "UNMOUNTING"}, uint8(s), "SegmentStatus")
}
