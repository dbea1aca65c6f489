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
//     UnregisterMemory refuses new accesses at once and waits for
//     transfers touching the buffer (and for same-host peers to unmap it).
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
//     returns; the receiver drains Notifications.
//
// Transports are tried in Config.Protocols order (default shm, cxl, rdma,
// efa, tcp; one that cannot start here is skipped with one log line); the
// first that accepts a target range carries it. The wire formats are
// documented in engine/metadata (handshake, descriptor), engine/transport/
// tcp, shm, cxl, rdma and efa. With an etcd or Redis metadata store, an
// opened segment's descriptor is followed by a watch.
package engine
