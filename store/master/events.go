package master

// EventKind says what happened to cached data.
type EventKind uint8

// Event kinds, mapped by the KV-event wiring to BlockStored,
// BlockRemoved and AllBlocksCleared.
const (
	EventStored EventKind = iota + 1
	EventRemoved
	EventCleared
)

// RemoveReason says why an object went away.
type RemoveReason uint8

// Reasons for EventRemoved.
const (
	ReasonRemoved RemoveReason = iota + 1 // Remove, BatchRemove, RemoveByRegex, RemoveAll
	ReasonEvicted                         // eviction
	ReasonLost                            // its last replica's segment went away
)

// Event tells an EventSink that an object was stored or removed. Stored
// carries the BlockMeta given to PutEnd; Removed carries the block hashes
// kept from it (nil when none was given).
type Event struct {
	Kind     EventKind
	Reason   RemoveReason // EventRemoved only
	Key      string       // empty for EventCleared
	Size     uint64
	Replicas []Replica
	Block    *BlockMeta
}

// EventSink receives events. The master queues each event under the lock
// of the key's shard (all shards for EventCleared) and calls Emit after it
// let go of the shard, reservation, allocator and segment locks (an
// unmount, expiry or eviction in progress may still hold segMu or
// evictMu), one event at a time, in queue order: events of one key arrive
// in the order of the changes. Emit may block (a publisher's Block
// overflow policy): the calls whose events wait behind it wait, other RPCs
// on the same shards do not. It must not call back into the Master. The
// event is the sink's to keep.
type EventSink interface {
	Emit(e *Event)
}
