// Package alloc places the store's replicas: it holds the segments that
// clients mount (memory they contribute to the pool), one offset
// allocator per segment (internal/offalloc: O(1), bin rounding), and the
// placement strategies. It handles numbers only; no memory is touched and
// nothing here speaks gRPC or the transfer engine.
//
// # Contract
//
//   - A segment is [Base, Base+Size) of a transfer-engine segment Name,
//     mounted by a client. IDs are unique (Mount of a known ID is
//     errcode.ErrSegmentAlreadyExists); names need not be, but the ranges
//     of one name never overlap (Mount of a range that overlaps a mounted
//     or unmounting segment of the same name is ErrSegmentAlreadyExists,
//     whichever client mounts it). Mount gives the
//     segment an index (uint32) used everywhere else; released indices are
//     reused last-in first-out.
//   - A replica of size n reserves Reserved(n) bytes: n rounded up to
//     Alignment (64) and then to its size class (at most 12.5% more).
//     Placement.Addr = Base + offset. Free needs the size the placement was
//     made with; a stale, double or mismatched Free is an error and changes
//     nothing.
//   - Choose returns up to Request.Replicas distinct segments that can hold
//     the size: preferred names first (in the given order), then the
//     caller's own segments (strategy LocalFirst, or Request.SameNode),
//     then by strategy: Random picks uniformly among the segments that can
//     hold the size (among more than 64 by sampling, so a pick costs the
//     same among 16,384 segments as among 16, walking them all only when
//     8 samples in a row miss), FreeRatioFirst the highest free ratio
//     (among more than 64 segments the freest of 16 random ones per
//     replica, walking them all only when none of the 16 fits). Fewer segments
//     than replicas gives fewer replicas (best effort), down to
//     Request.MinReplicas (at least one); fewer gives
//     errcode.ErrNoAvailableHandle. Choose may use randomness.
//   - A suspect segment (MarkSuspect: writes to it failed) is chosen only
//     when the others cannot give MinReplicas; ClearSuspect clears the
//     flag of a client's segments (the master does on its heartbeat).
//     The flag is soft state: it changes no placement already made.
//   - Choose (with Request.Into) and AllocateSetInto write into a
//     caller's buffer when it is large enough, so a batch of puts
//     allocates its answers once; the results are the same.
//   - AllocateOn / AllocateSet are deterministic: the same sequence of
//     allocations and frees on a segment since its Mount yields the same
//     addresses, so a replayed operation log reproduces them.
//   - Layout and Indices describe a segment's ranges (with each free
//     range's rank in its size class) and the table's released indices;
//     RestoreIndices and Restore rebuild them in a fresh allocator, which
//     then gives every later AllocateOn, Free and Mount the same result
//     (snapshots).
//   - Unmount stops placement on a segment (allocations on it fail from
//     then on; frees still work); Release removes it once the caller has
//     dropped every placement on it.
//
// # Concurrency
//
// All methods are safe for concurrent use. The segment table is
// copy-on-write (readers take no lock): a change copies its index slices
// and, of each map (by ID, name, client), only the one of 64 shards it
// writes; each segment has its own mutex;
// table changes (Mount, Unmount, Release) are serialised by one mutex.
// Lock order: table mutex, then segment mutexes in index order.
// AllocateSet and FreeSet hold the locks of all their segments while they
// run their commit function, and Mount / Unmount / Release run theirs
// before the change is visible, so a caller that records each change in
// commit (the master's operation log) records them in an order that is a
// valid serialisation per segment.
package alloc
