// Package engine is Crescent's transfer engine: it moves bytes between
// registered local memory and the registered memory of peer engines
// ("segments"), in batches, over the best transport each target allows.
//
// # Contract
//
//   - New starts an engine named after its handshake address "host:port"
//     (P2P handshake, the default, picks a free port in 15000–17000 when
//     none is given). Close stops it; every method afterwards returns
//     ErrClosed.
//   - RegisterMemory publishes a buffer in the local segment descriptor;
//     memory from a mempool.Pool is also shareable with same-host peers.
//     UnregisterMemory refuses new accesses at once, publishes the
//     descriptor without the buffer, and waits for transfers touching it
//     (and for same-host peers to unmap it). Only nil means the memory
//     may be reused: ErrUnregisterBusy (transfers outlived ctx) is
//     retried by calling UnregisterMemory again; ErrQuarantined (a
//     *QuarantineError: a peer did not confirm it unmapped the buffer)
//     holds the memory until its Released channel closes, when the
//     peer's connection is gone. Meanwhile the range cannot be registered
//     again. When a transport fails RegisterMemory, the transports that
//     registered the buffer before it undo it, in reverse order.
//   - OpenSegment resolves a peer by name and returns a handle; requests
//     address the peer's memory by its virtual addresses, as the
//     reference engine does. The descriptor is cached and fetched again
//     when a request names a range the cached copy lacks.
//   - AllocateBatch/Submit/Wait/FreeBatch: a Submit validates every
//     request first (local bytes inside registered memory, target range
//     inside one of the segment's buffers, non-zero length, no overflow)
//     and either starts all of them or none. Each request ends COMPLETED,
//     FAILED, TIMEOUT or CANCELED with its byte count; Status, BatchStatus
//     and Done observe it without waiting. Wait honours its context: when
//     it ends first, unfinished requests end TIMEOUT or CANCELED. No
//     request outlives Config.TransferTimeout. FreeBatch is refused while
//     a transport still owns a request's buffer.
//   - Handles (BatchID, SegmentID) pack a slot and a generation: a freed,
//     stale or forged handle gets ErrInvalidBatch/ErrInvalidSegment, never
//     another object.
//   - SubmitWithNotify attaches a message delivered to a segment (over the
//     handshake's Notify frame) once the batch completed, before Wait
//     returns; the receiver drains Notifications. Received notifications
//     wait in a ring bounded by Config.NotifyBudget bytes (default 16
//     MiB) and NotifyQueue entries; beyond either the oldest are dropped
//     (Stats.NotificationsDropped), as are messages over
//     NotifyMaxMessage (default 64 KiB; the Notify frame itself is
//     bounded by the handshake's MaxFrame before it is read).
//     Config.Notifications = NotifyOff refuses them (the sender gets
//     ErrRejected) and stores nothing. A notification's outcome
//     (BatchStatus.NotifyErr) belongs to the round of Submits it was
//     attached to, never a later one. Notify sends one with no batch.
//   - Opened segments keep their descriptor cached (re-fetched when a
//     request falls outside it, or every Config.SegmentRefresh);
//     RefreshSegment and RefreshSegments fetch now. CheckRange answers
//     whether a range lies in a registered buffer (fetching once more if
//     not) before a caller allocates for it (ErrOutOfBounds otherwise).
//   - InstallTransport starts a transport on a live engine (registering
//     the buffers registered so far with it) and UninstallTransport stops
//     one; each publishes the descriptor again, so peers learn the change
//     on their next fetch (watch, SegmentRefresh, RefreshSegment).
//     Requests a transport carried when it was uninstalled end FAILED and
//     later ones it alone could carry are refused (ErrNoTransport); both
//     errors wrap ErrTransportUninstalled and name it. Installing a
//     running transport does nothing.
//
// Transports are tried in Config.Protocols order (default shm, cxl, rdma,
// efa, tcp; those that cannot start here are skipped, all named with why
// in one log line: info when merely absent, warn on a failure); the first
// that accepts a target range carries it. The wire formats are
// documented in engine/metadata (handshake, descriptor), engine/transport/
// tcp, shm, cxl, rdma and efa. With an etcd or Redis metadata store, an
// opened segment's descriptor is followed by a watch.
//
// # Security of the data plane
//
// Config.Token (the cluster token, auth.LoadToken of --token_file) turns
// authentication on: every connection this engine serves or dials -- the
// P2P handshake, each TCP data lane, the shm control socket -- runs the
// internal/auth challenge once, with its own purpose, before the first
// frame; a peer that fails is closed before anything is served, and then
// frames move as before (no per-request cost). Both ends must hold the
// same token. Without a token the wire is the reference's, and the
// handshake server and TCP data port admit same-host peers only
// (loopback and this host's own addresses: auth.SameHost; the protected
// default, said in one log line at New) unless Insecure (any address,
// unauthenticated) or MooncakeCompat (the same, for Mooncake peers, which
// cannot authenticate). MooncakeCompat or Insecure together with a Token
// is ErrInvalidConfig. The shm control socket always requires the
// owner's uid (SO_PEERCRED, shm.Config) and, with a token, the challenge.
// Not covered: the rdma, efa and cxl data planes move bytes by the NIC or
// the device (one-sided RDMA with rkeys, a shared CXL window), with no
// connection of ours to authenticate; their endpoint exchange rides the
// authenticated handshake, and descriptors from etcd, Redis or HTTP
// stores are as trusted as those stores.
//
// # Metadata backends
//
// The engine itself speaks only the P2P handshake (Config.MetadataServer
// "" or P2PHANDSHAKE). The store backends are opt-in imports, so a
// program links only what it uses:
//
//	import _ "github.com/crescent-kv/crescent/engine/metadata/etcdmeta"  // etcd://h:p[,h2:p2], bare h:p
//	import _ "github.com/crescent-kv/crescent/engine/metadata/redismeta" // redis://, rediss://
//	import _ "github.com/crescent-kv/crescent/engine/metadata/httpmeta"  // http://, https://
//	import _ "github.com/crescent-kv/crescent/engine/metadata/all"       // all of them (the binaries)
//
// New refuses a connection string whose scheme no imported package
// registered: the error is ErrInvalidConfig wrapping a
// metadata.SchemeError that names the import to add, such as
//
//	metadata: scheme "etcd" not registered: import _ "github.com/crescent-kv/crescent/engine/metadata/etcdmeta"
package engine
