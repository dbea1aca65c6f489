// Package master is the metadata service of Crescent's KV-cache store:
// which objects exist, where their replicas are, who is writing them,
// leases, pins, eviction and the liveness of the clients that contribute
// memory. It holds metadata only: it never touches the memory and never
// imports a transport. This package is the core (Go types, errcode
// errors) and links no RPC, HTTP server, Prometheus or ZMQ (an HA follower
// embeds it; TestCoreLinksNoRPC holds it so). The adapters around it:
//   - store/master/service puts the gRPC contract of store/storepb (and
//     crpc) in front of a Master;
//   - store/master/admin serves the admin HTTP pages and the Prometheus
//     metrics;
//   - store/master/kvevents turns the core's Events into vLLM-compatible
//     KV events on an event.Publisher.
//
// # Objects
//
// Keys are non-empty valid UTF-8 of at most MaxKeyLen (4096) bytes, else
// INVALID_KEY. An object is size bytes (> 0, else INVALID_PARAMS) with up
// to MaxReplicas (16) replicas, each a contiguous allocation on a distinct
// segment (package store/alloc); fewer segments than asked give fewer
// replicas, down to the config's MinReplicas (0 = 1): fewer is
// NO_AVAILABLE_HANDLE and places nothing. A ReplicateConfig with more
// replicas than the maximum, MinReplicas above the replica count, a
// soft-pin TTL above MaxSoftPinTTL (or negative), both pins, or an empty
// preferred name is INVALID_PARAMS.
//
//   - PutStart(client, key, size, config) places the replicas (status
//     PROCESSING) and records client as the writer. A complete key is
//     OBJECT_ALREADY_EXISTS; so is an unfinished one younger than
//     PutDiscardTimeout (30s). An older unfinished put is taken over: the
//     key is reused at once, but the old replicas are quarantined and freed
//     only at the old put's start + PutReleaseTimeout, because the old
//     writer may still be writing into them (the reference does the same).
//     When no segment can hold the object, one eviction round runs and
//     placement is tried once more.
//   - PutEnd: missing key OBJECT_NOT_FOUND, another client's put
//     ILLEGAL_CLIENT; marks the object COMPLETE (visible) and emits Stored.
//     Ending a complete object again succeeds (a retried RPC).
//   - PutRevoke: same checks (a complete object is INVALID_WRITE); frees
//     the replicas at once.
//   - Generations (Crescent's): PutStart numbers each put (PutStartGen, the
//     generation field of PutStartResponse; never 0) and the writer sends
//     it back with PutEnd/PutRevoke. When the key holds another put (this
//     one was taken over, or removed and the key put again), finished or
//     not, the answer is REPLICA_IS_GONE and nothing changes: the late
//     writer's bytes were not stored, and it cannot complete or free its
//     successor's put. Generation 0 (the reference's clients) is not
//     checked. A record keeps the low 32 bits; OpPutStart logs the
//     generation and a replaying standby continues after the highest.
//   - An unfinished put older than PutReleaseTimeout (600s) is freed.
//   - Reservations (Crescent's, not the reference's): Reserve(client,
//     size, config, count) places up to count unfinished objects under no
//     key, with ids from a master-wide counter, as PutStart would place
//     them, but never evicts for them (NO_AVAILABLE_HANDLE when none fits).
//     Commit(client, key, id) binds one to a key and completes it in one
//     step (Stored event): an unknown, given-back, lost or older than
//     PutDiscardTimeout reservation is REPLICA_IS_GONE, another client's
//     ILLEGAL_CLIENT, and a taken key OBJECT_ALREADY_EXISTS with the
//     reservation left usable (an old unfinished put is taken over as by
//     PutStart). Unreserve frees at once; reservations lose replicas with
//     their segment and are freed at PutReleaseTimeout. They count as
//     allocated space and are never evicted.
//   - GetReplicaList: only complete objects (unfinished:
//     REPLICA_IS_NOT_READY); grants a lease, lease = max(lease, now +
//     LeaseTTL) and renews a soft pin the same way; the answer carries
//     LeaseTTL. ExistKey answers false for unfinished puts and grants a
//     lease like Get unless noLease (probes should not hold objects back
//     from eviction).
//   - Remove(key, force): leased OBJECT_HAS_LEASE and unfinished
//     OBJECT_REPLICA_BUSY unless force; a hard pin does not protect from
//     Remove. A forced Remove of an unfinished put quarantines its space
//     like a takeover; a forced remove (Remove, RemoveByRegex, RemoveAll)
//     of a leased object quarantines its space until the lease ends
//     (Op.HoldUntil), so no reader within its lease reads another
//     object's bytes. RemoveByRegex (RE2, whole key) and RemoveAll(force)
//     remove complete objects only, skipping leased ones unless force;
//     RemoveAll removes hard-pinned objects too. RemoveByRegex refuses
//     (INVALID_PARAMS, quoting at most 64 bytes of it) an expression longer
//     than MaxRegexLen (1 KiB) or compiling to more than MaxRegexInsts
//     (2048) instructions; it matches keys outside the shard locks, on a
//     snapshot of each shard, re-checking matches under the lock, and stops
//     with RPC_TIMEOUT (the message says how many it removed) past
//     RegexBudget (5s).
//
// # Pins and eviction
//
// A soft pin lasts until PutEnd + TTL (the config's or SoftPinTTL, 30m)
// and is renewed by every lease grant; a hard pin lasts forever. When
// allocated/capacity exceeds EvictionHighWatermark (0.90, checked every
// EvictInterval) or an allocation fails, an eviction round frees at least
// EvictionRatio (0.05) of the total capacity, or all it can: candidates
// are complete, not hard-pinned, not leased; oldest first, where objects
// never leased are oldest (by PutEnd time) and the rest go by lease
// deadline. Soft-pinned objects are candidates only in a second pass, run
// when the first falls short and KeepSoftPinned is false. A round that
// frees nothing holds off watermark rounds for a second.
//
// # Segments and clients
//
// MountSegment starts tracking the client: it must Ping within ClientTTL
// (10s). A client silent for longer loses its segments: placement on them
// stops, their replicas are dropped, objects left with none are erased
// (Removed events, reason Lost), the segments are released and the client
// is forgotten; its next Ping answers NEED_REMOUNT, and ReMountSegment
// restores it. A client the master never tracked (a pure client, or one
// that talked to another master) also gets NEED_REMOUNT. UnmountSegment
// does the same dropping for one segment; when it takes the client's last
// segment (a clean Close) the client is forgotten at once (OpClientLeft):
// it is neither active nor, later, expired, and what went with the
// segment is counted as unmounted (UnmountedReplicas, UnmountedKeys,
// DepartedClients), not lost (DroppedReplicas, LostKeys, ExpiredClients
// count expiries only). A segment whose range overlaps a mounted one of
// the same engine segment name is SEGMENT_ALREADY_EXISTS, whoever mounts
// it: two pool segments on the same bytes would place two objects there.
// The view version Ping reports is constant for a master's lifetime
// (random unless configured).
//
// A client whose writes to segments failed reports them
// (ReportFailedSegments, at most 64; the reporter's own and unknown ids
// are ignored): each becomes suspect until its owner's next Ping. New
// replicas avoid suspect segments: PutStart first places without them
// (evicting to make room on the others when they are full) and uses them
// only when the others cannot give MinReplicas; Reserve never uses them.
// A report removes nothing and is soft state (not logged); Stats,
// /metrics (master_suspect_segment_count) and /get_all_segments show
// suspect segments (store/master/admin).
//
// # Operation log
//
// Every metadata change goes through one function (apply) as an Op:
// PutStart (with the segments chosen and the addresses obtained), PutEnd,
// PutRevoke, Remove, Evict, Discard, DiscardFree, PutRelease, DropReplica,
// Mount, UnmountStart, Unmount, ClientExpired, Reserve (with the id
// given), Commit, Unreserve, DropReserved, ClientLeft. When Config.OpLog is set,
// each Op is appended while the master holds the locks of everything it
// touches, so the append order is a valid serialisation. Replay applies a
// logged Op on another master (a standby): placement is not chosen again
// but reproduced, and an address, index or state that does not match is
// ErrReplayDiverged. Leases, soft-pin renewals and heartbeats are soft
// state: not logged, so a promoted standby starts with no leases, soft
// pins at their PutEnd deadline, and every client freshly seen. Replay
// neither logs nor emits events.
//
// # Export and Import (snapshots)
//
// Export writes the replicated state (what DumpState covers, plus each
// segment's ranges with their free-list order and the segment table's
// released indices) as Records; Import loads them into a fresh master
// before Start. The imported master's DumpState is byte-identical and it
// places every later allocation and mount exactly where the exporter
// would, so Replay of the log past the snapshot never diverges. Export
// takes one lock at a time and reports the longest hold; it is exact only
// on a master no change runs on (ha/oplog builds snapshots on a scratch
// master replayed from the log). Import refuses (ErrBadSnapshot) records
// out of order and replicas that are not exactly the allocated ranges.
//
// # Events
//
// With Config.Events set, the sink gets Stored at PutEnd (with the
// BlockMeta the writer gave), Removed at Remove, eviction and loss (with
// the block hashes kept from PutEnd), and RemoveAll's Cleared (one event
// when no complete object survives, else Removed per key). Events are
// queued under the key's shard lock and handed to the sink after the
// locks are let go (evqueue.go), in order; a sink that blocks holds back
// the emitting calls only, never a shard. store/master/kvevents.Bridge is
// the sink that publishes them as KV events.
//
// # Hot-cache invalidations
//
// A client that caches values (store/local's hot cache) or locations
// (store's Config.LocationCache) subscribes with WaitInvalidations, a
// long poll: each poll acknowledges the last sequence number it applied
// and is answered with the invalidations queued since ((key, put
// generation) of every complete object removed, evicted or lost, or that
// lost one of its replicas with a segment, numbered per subscriber
// without gaps), or, with none,
// a heartbeat after at most a third of InvalidationTTL (1 s). A new or
// unknown subscription, a queue over MaxInvalidationQueue (4096) and an
// ack of a number never sent are answered with a reset (drop
// everything). Answers carry at most 1024 items and 1 MiB of keys
// (More: ask again); at most MaxSubscribers (1024) exist, and one not
// polled for 10 TTLs is dropped. The subscriber serves cached values only
// within InvalidationTTL of sending the poll of its last answer without
// More. Every remove (Remove, BatchRemove, RemoveByRegex, RemoveAll)
// answers, and every PutEnd and Commit makes its new object visible,
// only once each subscriber acknowledged what was queued before, or
// InvalidationTTL later: a subscriber that did not answer by then had no
// answer composed after the queueing, so its freshness ran out. A
// subscriber whose last poll is a TTL old is not waited for at all (its
// freshness ran out before), and one that ends its subscription
// (Unsubscribe, as a closing client does) is forgotten at once. So no
// reader of a cache sees a value once its remove or replacement has been
// answered. Eviction and loss do not wait (no caller), but the next
// generation of the key does. The registry's mutex is a leaf (items are
// queued under shard locks); with no subscriber nothing is queued or
// waited for. A restored master or a promoted leader starts with no
// subscribers (their polls get resets) while the caches of the master
// before it may stay fresh for up to InvalidationTTL after its last
// answer: so a master that starts with state (Start finds objects or
// segments) holds every barrier until InvalidationTTL after Start, and
// nothing removed or replaced in that time is answered before those
// caches lapsed (TestInvalidationHoldAfterRestore). A master that starts
// empty knows no key that a cache could hold and holds nothing.
//
// # Concurrency and memory
//
// All methods are safe for concurrent use. Objects live in Shards (1024)
// shards by hash of the key, each with its own mutex. Lock order:
// segMu (mount, unmount, expiry) or evictMu (one eviction round at a
// time) -> shard (one at a time; RemoveAll takes all, in index order) ->
// one reservation table (64, by owner: a client's Reserve, Commit and
// Unreserve take its table only; unmount and release walk them one at a
// time, unmount before its shard walk) -> allocator table -> discardMu
// (quarantine) -> segments (in index order);
// clientMu and the event queue's mutex are leaves; the sink is called
// with none of these held but segMu or evictMu. PutStart releases its shard before running an
// eviction round. Whole-table
// work (eviction scans, unmount, regex, release) takes shards one at a
// time.
//
// Memory layout (shard.go). A shard keeps its objects in three
// structures, none of them a Go map or a string per key:
//   - records: 56 bytes each (size, lease, ext pointer, first replica,
//     generation, flags; soft-pin deadline, owner, more replicas, pin TTL
//     and block hashes live in ext, which most complete objects lack) in
//     a slab of 4 KiB chunks; a slot is reused after a remove;
//   - a key arena: append-only chunks of entries (slot, uvarint length,
//     key bytes). A removed key's slot is overwritten with a dead mark;
//     its bytes stay until the arena is compacted (when more than half of
//     it is dead), which copies the live entries to new chunks. Key bytes
//     are never written twice, so a key string aliasing the arena (as
//     walks hand out) is immutable; ops and events that outlive the walk
//     get a copy;
//   - an index: open addressing, 8-byte entries (high 32 bits of the
//     key's maphash with the master's random seed, arena reference),
//     linear probing, backward-shift deletion, grown by a quarter above
//     13/16 full. A tag match is confirmed on the arena bytes. The same
//     hash picks the shard (its low bits), so a key operation hashes its
//     key once (Master.locate).
//
// Batch calls (BatchPutStart, BatchPutEnd, Commit, Reserve,
// BatchGetReplicaList) read the clock once for all their items: their
// ops carry the batch's time. BatchPutStart and BatchPutEnd also allocate
// their items' ops, replica descriptions, segment and address lists once
// per batch (one slice each, clipped per item: a sink keeps its ops;
// without a sink one op serves every item); a batch put costs about one
// heap allocation per key, the unfinished object's ext
// (TestBatchPutAllocs). BatchPutStartInto and BatchGetReplicaListInto
// take their result and replica arrays from a caller's BatchBuffers
// (the RPC handlers pool them): the results stay valid until the
// buffers are used again or Reset. A live put looks its key up once per step:
// checks that only a replay needs (the key absent at PutStart) are made
// on replay only.
//
// The slab is compacted when more than three quarters of it (and 1024
// slots) are free. At a million 26-byte keys with one replica a key costs
// about 149 bytes (BenchmarkBytesPerKey; 140 to 144 at ten million): 58
// for the record, 34 for the arena entry, 12 for the index and 43 for the
// allocator's range node (store/alloc, internal/offalloc). A soft-pinned
// object also has ext (its pin deadline), 80 bytes more.
package master
