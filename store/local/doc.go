// Package local serves the processes of one host from one real client:
// a store.Client (in crescent-client, or embedded) runs Serve on a Unix
// socket; each inference process is a light dummy client (Dial) with the
// store client's API, forwarded over the socket, reading values straight
// out of shared memory.
//
// # Contract
//
//   - Registration: the first frame is Hello. The server reads the peer's
//     credentials with SO_PEERCRED and accepts only its own uid and
//     Options.AllowUIDs (others get ILLEGAL_CLIENT naming the uid); the
//     socket file has Options.SocketMode (0600). It answers with a random
//     16-byte token that every later frame must carry (a wrong token gets
//     ILLEGAL_CLIENT and the connection is closed), the ping interval, and,
//     when the hot cache is shared (Options.Shm), the cache's memfd, passed
//     once with SCM_RIGHTS and mapped by the dummy.
//   - Liveness: a dummy pings every PingInterval (1 s); a dummy silent for
//     ExpireAfter (10 s) is dropped. A frame whose first byte arrived must
//     be complete within RecvTimeout (5 s). Dropping a dummy (expiry,
//     disconnect, death, a protocol error) releases every view it held and
//     unmaps and unregisters every buffer it registered.
//   - Bounds: frames are at most MaxInline (64 MiB) plus 1 MiB (a Hello
//     request's n at most 32, its body being the version: a larger one
//     gets INVALID_PARAMS and the connection is closed), batches 1024
//     items, strings 64 KiB, registered buffers 64 per dummy and 1 TiB
//     each, two descriptors per message: all checked before anything is
//     allocated, and a frame's body buffer grows as its bytes arrive
//     (64 KiB, then doubling), so a header alone claims no more. A dummy
//     holds at most 65536 (maxInflight × maxBatch) unreleased views;
//     GetBuffer beyond that answers NO_AVAILABLE_HANDLE, the views held
//     stay valid, and a Release makes room again. A dummy holds views of
//     at most its share of the cache's blocks (the blocks divided by the
//     dummies registered, at least one); a GetBuffer that would pin one
//     more is answered with a copy (Stats.ShareCopies), so no dummy can
//     pin the whole cache while others are served copies. Every (region, offset,
//     length) a dummy sends is checked against the region; a buffer a
//     dummy registers must be a memfd sealed against shrinking
//     (engine/mempool's are), so it cannot make the server's accesses
//     fault.
//   - Calls: Put/PutFrom, Get, GetInto, BatchPut, BatchGet, BatchGetInto,
//     IsExist, BatchIsExist, Remove, BatchRemove answer as store.Client's
//     (errors carry the same store/errcode codes); block metadata is not
//     forwarded. A value in a pool registered with Dummy.RegisterPool
//     moves by reference: the server mapped the pool and registered it
//     with its engine, so the replica is read or written in place. Other
//     values are carried in the frame (one copy each way).
//   - GetBuffer/BatchGetBuffer: with a shared cache the answer is a view
//     of a cache block (Buffer.Shared): a hit, or a miss read straight
//     into a block (published when admitted, else freed at Release). The
//     server holds a reference per view until the dummy releases it, so
//     a block a dummy holds is never reused. Values larger than a block,
//     past the dummy's share of blocks (above) or with every block held,
//     and every value without a shared cache, come back as private
//     copies.
//   - Reconnect: when the connection breaks, calls in progress fail with
//     ErrDisconnected and the next call dials again, registers anew (a
//     new token), maps the new cache and passes the registered pools
//     again. Views of the old mapping stay readable until released.
//
// # Hot cache
//
// Options.CacheSize bytes (MC_STORE_LOCAL_HOT_CACHE_SIZE; 0 = none) of a
// memfd arena cut into fixed blocks of Options.BlockSize
// (MC_STORE_LOCAL_HOT_BLOCK_SIZE, default 16 MiB), shared with dummies
// when Options.Shm (MC_STORE_LOCAL_HOT_CACHE_USE_SHM=1). A miss counts
// the key in a count-min sketch (4 rows of saturating 4-bit counters,
// halved every 10×width increments); a key missed
// Options.AdmissionThreshold times (MC_STORE_LOCAL_HOT_ADMISSION_THRESHOLD,
// default 2) is admitted: Get/GetInto queue a fill (a bounded queue,
// FillQueue; a full queue drops the fill), GetBuffer in shm mode reads
// into the block itself. Without shm only replicas outside the real
// client's own segment are cached (a local replica is as fast). Blocks
// are reused least recently used first, never while referenced.
//
// A block remembers the replica it was read from and the read lease of
// that read. The server subscribes to the master's invalidations
// (store.Client.WatchInvalidations; see store/master's doc): an
// invalidated key is withdrawn before the poll that acknowledges it is
// sent, and a reset (new subscription, gap, overflow) withdraws every
// block and every fill in progress. A block is served only while the
// subscription is fresh (an answer within the master's InvalidationTTL,
// 1 s, less a tenth, of its poll's sending); otherwise every lookup is a
// miss read from the master (Stats.StaleMisses). A fresh hit within the
// lease (less 100 ms) is served without the master; after it, the server
// asks the master again (renewing the lease) and serves the block only
// if the replica is the one it was read from and no invalidation
// withdrew it meanwhile, else withdraws it. Since removes answer, and
// new generations become visible, only after subscribers acknowledged,
// a value removed or replaced from any host is never served once that
// remove or put has answered. Writes and removes through the server withdraw the
// key before and after they reach the master, and a fill publishes only
// if the key's fill token it took before its read is still current: a
// fill that read a value, then a remove or overwrite, then the fill's
// publication — the reference's dirty read — publishes nothing. A view
// already handed out keeps showing the bytes it was given (the block is
// not reused until released).
//
// # Wire format
//
// Little-endian frames on a Unix stream socket:
//
//	offset size
//	0      4    n: bytes after this field (28 + body), at most 65 MiB
//	4      1    op (1 Hello, 2 Ping, 3 Register, 4 Unregister, 5 Put, 6 Get,
//	            7 GetBuffer, 8 Release, 9 Exist, 10 Remove, 11 BatchPut,
//	            12 BatchGet, 13 BatchGetBuffer, 14 BatchExist, 15 BatchRemove)
//	5      1    status (replies: 0 ok, 1 error; requests: 0)
//	6      2    reserved, 0
//	8      8    request id (0: no reply wanted, as for Ping and Release)
//	16     16   token (requests after Hello; zero in replies)
//	32     n-28 body
//
// Body fields: u8, u32, u64, i32; str and bytes are a u32 length and the
// bytes. An error reply's body is i32 code (store/errcode) and str
// message; a batch item's status is i32 code, followed by str message
// when the code is not 0. A value reference is u8 kind then, for kind 0,
// bytes inline (in requests; in Get requests nothing: the reply carries
// them), for kind 1, u32 region, u64 offset, u64 length. A
// ReplicateConfig is u32 replicas, u32 min replicas, u8 soft pin, u64
// soft pin TTL (ns), u8 hard pin, u8 same node, u32 count and str
// preferred segments.
//
//	Hello       req u32 version (1)
//	            rep [16]token, u32 ping ms, u32 expiry ms, u64 cache size,
//	                u64 block size (cache memfd attached when size > 0)
//	Register    req u64 size (memfd attached)        rep u32 region
//	Unregister  req u32 region                       rep -
//	Put         req str key, value ref, rc           rep -
//	Get         req str key, value ref (0 or 1)      rep u64 n, bytes when inline
//	GetBuffer   req str key                          rep view
//	Release     req u32 count, count × u64 handle    (no reply)
//	Exist       req str key                          rep u8
//	Remove      req str key, u8 force                rep -
//	BatchPut    req u32 n, n × (str key, value ref), rc      rep u32 n, n × status
//	BatchGet    req u32 n, n × (str key, value ref)  rep u32 n, n × (status, u64 n, bytes when inline)
//	BatchGetBuffer req u32 n, n × str key            rep u32 n, n × (status, view)
//	BatchExist  req u32 n, n × str key               rep u32 n, n × (status, u8)
//	BatchRemove req u32 n, n × str key, u8 force     rep u32 n, n × status
//
// A view is status 0 (GetBuffer: none), then u8 kind: 0 with bytes
// inline and u64 0, or 2 with u64 handle, u64 offset and u64 length in
// the shared cache, and u64 lease deadline (Unix ns).
package local
