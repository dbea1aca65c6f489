// Package kvevents is the bridge from the master's events to the KV event
// stream (package event): Bridge is a store/master.EventSink (set it as
// Config.Events) that publishes vLLM-compatible events on an
// event.Publisher, which owns the wire format (msgpack on ZMQ).
//
// Mapping: Stored (PutEnd) is BlockStored, Removed (Remove, eviction,
// loss of the last replica) is BlockRemoved, Cleared (RemoveAll, nothing
// left) is AllBlocksCleared. Block hashes, parent, token ids, block size
// and lora come from the BlockMeta the writer gave PutEnd; without one the
// key is parsed as the reference does (ParseKeyHash: the whole key as a
// decimal u64, or hex after 0x/0X) and a key that parses to neither sends
// nothing and is counted (Unparsed). Medium is CPU when a memory replica
// exists, else DISK. Events the publisher refuses are counted (Failed).
// Emit never waits under the publisher's DropOldest policy; under Block
// the emitting master calls wait for queue room, outside the shard locks.
package kvevents
