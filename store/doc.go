// Package store is the client library of Crescent's distributed KV-cache
// store: it talks to the master (the service of store/storepb, over crpc
// when the master answers it, else gRPC: Config.MasterProtocol; with
// "auto", a master down at start is tried over crpc again at each call
// until it answers) for
// metadata (Config.MasterProtocol "grpc_tuned": gRPC with
// internal/grpctune's options, for a master run with --grpc_tuned;
// Config.MasterDialer: any other grpc.ClientConnInterface, as the bench's
// drpc) and moves the bytes itself, between its own memory and the
// memory other clients contribute, through the transfer engine (package
// engine).
//
// # Contract
//
//   - Identity: a client's id is derived from a 32-byte session secret it
//     draws at New (internal/auth.ClientID), and every call that acts as
//     the client carries the session; the master refuses a call whose
//     session does not prove its id (ILLEGAL_CLIENT). The session never
//     changes for the client's life, so it survives a master restart, a
//     failover and a re-mount with nothing stored on the master.
//   - Security (Config.TokenFile, TLSCA/TLSCert/TLSKey, AdminTokenFile, or
//     Config.Security): every connection to the master proves the cluster
//     token (once, before any frame; crpc and gRPC alike) and/or runs TLS
//     (mTLS with a client certificate); admin calls (RemoveAll,
//     RemoveByRegex, forced removes) carry the admin token. A master that
//     needs what the client lacks refuses at New (crpc.ErrTokenRequired,
//     crpc.ErrTLSRequired, auth.ErrRefused), not at each call.
//   - New connects to the master, starts (or shares) a transfer engine,
//     registers a staging pool (Config.LocalBufferSize) with it, and, when
//     Config.GlobalSegmentSize > 0, contributes that much memory to the
//     pool: a memfd arena from engine/mempool, registered with the engine
//     and mounted on the master as one segment named after the engine's
//     segment (its "host:port"). A client that contributes nothing is a
//     pure client. Close unmounts the segments first, then stops
//     heartbeats, withdraws the memory from the engine and releases it.
//   - Mount(size) after New contributes one more segment and Unmount(id)
//     withdraws one: from the master, then the engine; its memory is
//     unmapped once the calls in progress have returned (Unmount waits
//     for them, holding new calls back meanwhile) and no Buffer views the
//     client's memory (at the last Release, or at Close).
//   - Heartbeats (Ping, every Config.HeartbeatInterval) run only while a
//     segment is mounted: they start with the first mount (in New or
//     Mount) and stop with the last Unmount; a client with no segment
//     sends none. A Ping answered NEED_REMOUNT (the master forgot
//     this client, e.g. after it missed heartbeats for the master's client
//     TTL, or a new leader never knew it) re-mounts every segment with
//     ReMountSegment; the objects the master dropped meanwhile are gone.
//   - Put: PutStart reserves replica space; each replica is written, with
//     a plain copy when it lies in this client's own segment and with an
//     engine WRITE otherwise (straight from the caller's memory when it is
//     registered, through a staging buffer when it is not); then PutEnd.
//     Any failure after PutStart ends in PutRevoke, so a half-written
//     object is never visible. PutEnd and PutRevoke carry the generation
//     PutStart gave: a put taken over meanwhile (it stalled past the
//     master's discard timeout) fails with REPLICA_IS_GONE instead of
//     completing its successor. Batch forms answer per item. A put whose
//     write to a segment failed (its client died, say) reports the
//     segment to the master (ReportFailedSegments), which places new
//     replicas elsewhere until that segment's client pings again, and is
//     placed again, up to Config.PutRetries (2) more times within the
//     caller's context; reservations held on the segment are given back.
//   - ReplicateConfig.Replicas is best effort down to MinReplicas (0 = 1):
//     a put that cannot place MinReplicas fails with NO_AVAILABLE_HANDLE.
//     Stats counts puts by the replicas they stored (StoredReplicas) and
//     those stored with fewer than asked (UnderReplicatedPuts).
//   - Put-ahead (Config.PutAhead, default 8 per class; negative turns it
//     off): after the second put of one value size and ReplicateConfig
//     that found no reservation, the client reserves space for that class
//     in the background (ReservePut), up to PutAhead reservations and
//     Config.PutAheadBytes (64 MiB) in all; each put of the class that
//     finds none while replacements are on their way raises the class's
//     count by one (more of its puts run at once than PutAhead covers),
//     up to 256, until the class idles; one request asks the master for
//     at most 64 (its bound per spec). A BatchPut takes reservations for
//     as many items as are held and PutStart/PutEnd for the rest, whose
//     BatchPutEnd runs beside the CommitPut. A put of a class with one at
//     hand writes into it and commits it with CommitPut, which asks in
//     the same RPC for what its class is missing once that is half the
//     class's count (or 32, half of one request's most), or at once when
//     the class holds none: one round trip instead of two, and a Reserve
//     call on the master every few puts rather than every put.
//     Concurrent single-key calls of one kind (PutStart, PutEnd, commits,
//     GetReplicaList) are merged into batch RPCs, at most two in flight.
//     A reservation is used only while younger than half the TTL the
//     master gives; older ones, those of a failed write, and all of them
//     at Close are given back (and, when a write fails at a segment,
//     every one held there). A commit answered REPLICA_IS_GONE retries
//     the put on the two-RPC path; a put answered NO_AVAILABLE_HANDLE
//     while reservations are held gives them back and retries once.
//   - Get: the time is taken, then GetReplicaList (which grants a read
//     lease of lease_ttl_ms); a complete memory replica is chosen (this
//     client's own segment first, then segments on the same host, then the
//     rest, trying the next on a transfer failure) and read; if the lease
//     has run out by the end of the read the result is discarded with
//     LEASE_EXPIRED, because the master may have evicted the object and
//     handed its space to another writer meanwhile.
//   - Location cache (Config.LocationCache entries, default 0 = off):
//     Get, GetInto, GetBuffer and the batch gets read a key's replicas
//     from a cached GetReplicaList answer, asking the master nothing,
//     while (a) the read lease it granted has more than a quarter of its
//     TTL left (the master neither evicts a leased object nor removes it
//     without force, and a forced remove holds its space until the lease
//     ends) and (b) the client's own invalidation subscription
//     (WatchInvalidations, started with the cache) is fresh. Every
//     remove, forced or not, eviction, loss, and replica dropped with a
//     segment is an invalidation that drops the entry before the master
//     answers the remove; an answer that an invalidation may have
//     overtaken (the shard's invalidation count moved while it was
//     asked for) is not cached. A get that fails from a cached entry
//     drops it and asks the master once. Locate always asks. Entries
//     are bounded per shard of 32; a full shard drops one at random.
//     Stats.LocationHits / LocationMisses count the gets.
//   - GetBuffer returns a view and a release: a replica in this client's
//     own segment is viewed in place (valid until the lease deadline the
//     Buffer reports), anything else is read into a buffer of the staging
//     pool (a heap buffer when the pool is short). Memory stays mapped
//     until every Buffer is released, even across Close.
//   - PutFrom, GetInto and BatchGetInto move bytes directly between the caller's buffer
//     and the replicas when the buffer lies in memory registered through
//     RegisterBuffer (or in this client's segment or staging pool), with no
//     copy in user space; unregistered buffers work too, through staging.
//   - Locate and ReadAt split a Get in two for local servers (store/local):
//     where the object is and its lease, then a read of exactly those
//     replicas, failing with LEASE_EXPIRED as Get does.
//   - WatchInvalidations subscribes a cache to the master's invalidations
//     (a long poll, WaitInvalidations; see store/master's doc): the
//     handler drops keys before the next poll acknowledges them, and
//     InvalidationWatch.Fresh says whether cached values may be served.
//   - Errors are store error codes (package store/errcode): test them with
//     errors.Is(err, errcode.ErrObjectNotFound) and the like. Failed RPCs
//     map through rpcerr.FromStatus (RPC_FAIL, RPC_TIMEOUT, or the code
//     the master sent); bad arguments are refused before any RPC with
//     INVALID_KEY / INVALID_PARAMS / BUFFER_OVERFLOW; transfer failures are
//     TRANSFER_FAIL wrapping the engine's error.
//   - All methods are safe for concurrent use. Close waits for calls in
//     progress; later calls return ErrClosed.
//
// # Masters in high availability
//
// Config.MasterAddr "etcd://h:p[,h2:p2]" or "redis://[user:pass@]h:p[/db]"
// (a plain host:port is one master, no HA) names where the leader view
// lives: the one crescent-master --ha_backend etcd|redis keeps (package
// ha/leader: prefix "crescent", cluster id Config.ClusterID, default
// "crescent"; view = leader's RPC address + version, the fencing term).
// The schemes are registered by importing store/haview
// (RegisterLeaderScheme, database/sql style), so the store package links
// neither etcd's client nor go-redis. The leader monitor runs apart from
// the heartbeat, in every HA client, segments or not:
//
//   - New reads the view (waiting within its context for a leader) and
//     connects to the leader; a goroutine then waits for view changes
//     (ha/leader's WaitChange), and every 3rd consecutive call answered
//     UNAVAILABLE makes it read the view at once (at most every 100 ms).
//   - Every view goes through one serialized switch: a view with no
//     leader, or a version not above the current one (a Redis that lost
//     its term counter), is ignored (Stats.StaleLeaderViews counts the
//     lower ones); otherwise the client opens a connection to the new
//     leader (crpc, gRPC, or "auto" settled at its first call, lazily:
//     a new leader warms up for a lease TTL before it serves), replaces
//     the old one and closes it, drops its put-ahead reservations (made
//     on the old leader), the answers of reservation requests booked
//     before the switch and the old ids it would have given back (a new
//     leader numbers its own; a request never sent may have been
//     answered by the new leader, whose reservations then wait for its
//     release timeout), and heartbeats at once, so the new leader's
//     NEED_REMOUNT re-mounts the segments. Stats.Leader, LeaderVersion
//     and LeaderSwitches tell where it is.
//   - The reservations are dropped (a new put-ahead epoch) before the
//     new connection is published, and each connection carries its
//     epoch. A request composed with reservation ids or bookings of one
//     epoch (CommitPut, ReservePut) is sent only on that epoch's
//     connection. On another it fails errStaleReservations unsent, and
//     its items are put again the two-RPC way.
//   - A call answered UNAVAILABLE (or cut off by a switch) is sent again,
//     on the new leader or after a pause (20 ms doubling to 250 ms) on
//     the same one, within the caller's context, if it is idempotent:
//     GetReplicaList, BatchGetReplicaList, ExistKey, BatchExistKey,
//     QuerySegmentStatus, ServiceReady, Ping, ReMountSegment,
//     ReportFailedSegments (IdempotentMethods; Stats.LeaderRetries), or
//     if it was never sent (crpc.NotSent: no connection could be made to
//     the leader, which is dead or not yet serving). Every other call
//     (puts, commits, reservations, removes, mount and unmount) that
//     reached a leader returns its error: the old leader may have
//     applied it, and only its log knows. So under crpc a failover makes
//     puts wait for the new leader instead of failing, unless the old
//     leader took them and died; gRPC gives no such mark, and a put there
//     fails UNAVAILABLE. Calls that ride one coalesced RPC (concurrent
//     Put, Get) share it until the last of their contexts ends; a lone
//     call's RPC has the caller's context, so a put waiting for a leader
//     fails when its context does, not at the RPC timeout.
//     No call is sent to a leader the client has
//     left, and a call cut off by a switch fails UNAVAILABLE (or, when
//     idempotent, runs again on the new leader).
//
// Stats returns the client's counters (bytes moved, put/get latency
// histograms, per-RPC counts and latencies, puts that went ahead); cmd/crescent-client exports
// them to Prometheus.
package store
