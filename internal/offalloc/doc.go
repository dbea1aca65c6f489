// Package offalloc is an O(1) offset allocator: it hands out ranges
// [Offset, Offset+Size) of an abstract address space of a fixed size and
// never touches the memory itself.
//
// # Design
//
// It follows the two-level segregated-fit scheme of Sebastian Aaltonen's
// OffsetAllocator (used by Mooncake's store), written from scratch for
// 64-bit sizes:
//
//   - Sizes map to bins by a small floating-point encoding: 3 mantissa bits
//     and an exponent, so each power-of-two range is split into 8 bins and a
//     bin's size differs from the next by at most 12.5%. Sizes below 8 are
//     their own bin. There are NumClasses (512) bins.
//   - A request is rounded up to the alignment and then to the exact size of
//     its bin (RoundUp), and exactly that many bytes are carved. Rounding waste
//     is therefore at most 12.5% of the aligned request, and the bins double
//     as size classes.
//   - Free ranges are kept in doubly linked lists, one per bin, indexed by the
//     bin of their size rounded down. A 64-bit top bitmap marks non-empty
//     groups of 8 bins and one 8-bit leaf bitmap per group marks non-empty
//     bins, so finding the first bin that can hold a request takes a few
//     bit-scan instructions.
//   - Every range (used or free) is a node linked to its address-order
//     neighbours; Free coalesces with free neighbours at once, so two free
//     ranges are never adjacent and an empty allocator is one free range.
//
// Because requests are rounded to exact bin sizes, the search is exact:
// Alloc(n) fails if and only if no free range is at least RoundUp(n) bytes
// long (equivalently RoundUp(n) > MaxAlloc()). AllocAligned trades that
// guarantee for speed, see its documentation.
//
// # Storage
//
// Nodes are 40-byte structs addressed by uint32 index, stored in chunks of
// 4096 (every chunk but the last is full); unused nodes form a free list
// threaded through them. Steady state Alloc/Free perform no heap
// allocation; the table only grows when the number of ranges (live
// allocations plus free ranges) exceeds its previous peak, by an eighth,
// and a growth copies at most the partial last chunk, never the table. An Allocation is a value (offset, size, opaque handle); a handle
// carries a generation number so a double free or a stale handle is detected
// and rejected with ErrNotAllocated without changing any state.
//
// # Concurrency
//
// An Allocator is not safe for concurrent use; callers serialise access
// (the mempool holds one lock per slab).
//
// With the invariants build tag every mutating call validates the
// structure (all of it while the node table holds at most 256 nodes, else
// the touched ranges and their neighbours) and panics on corruption.
package offalloc
