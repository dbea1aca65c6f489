// Package mempool is a slab memory pool over one memfd arena that lives
// outside the Go heap, so buffers never move and can be registered with
// NICs or shared with other processes.
//
// # Arena
//
// New creates a memfd (MFD_CLOEXEC), sizes it with ftruncate and maps it
// MAP_SHARED read-write. The size is rounded up to a multiple of the slab
// size. Unless Options.NoPrefault is set the whole arena is faulted in at
// creation with madvise(MADV_POPULATE_WRITE), or one write per page on
// kernels older than 5.14: first touch of memory costs about 16 µs per 4 KiB
// page on the project's VMs, and a pool must pay it once, not on the data
// path. The pool never returns memory to the kernel.
//
// Before creating the memfd, New checks the (rounded) size against
// Available: MemAvailable from /proc/meminfo and the room left in the
// process's memory cgroup and its ancestors (v2 memory.max minus
// memory.current, v1 memory.limit_in_bytes minus memory.usage_in_bytes,
// inactive page cache counted as free). A larger pool fails at once with
// ErrNotEnoughMemory naming the size and what is available, instead of
// prefaulting until the OOM killer ends this or another process; the check
// applies with NoPrefault too (touching the pages later would end the
// same way). Options.AllowOvercommit skips it. hugetlb pages come from
// their own reserved pool and are not checked (mmap fails cleanly when it
// is short); the fallback to ordinary pages is.
//
// # Huge pages
//
// With Options.HugePages the pool first asks for MFD_HUGETLB pages (the
// arena is then rounded up to the huge page size); this needs pages reserved
// in vm.nr_hugepages and otherwise fails at mmap. It then falls back to a
// normal memfd advised with MADV_HUGEPAGE, which only has an effect when the
// kernel's shmem THP policy (shmem_enabled under
// /sys/kernel/mm/transparent_hugepage, or its per-size override) is always,
// within_size or advise. Stats.HugePages reports what took effect (none, hugetlb, thp) and
// Stats.HugePageNote what was tried.
//
// # Slabs and allocation
//
// The arena is cut into slabs (16 MiB by default, a power of two between
// 64 KiB and 1 GiB). A request of n <= SlabSize bytes is served inside one
// slab by that slab's offset allocator (internal/offalloc): n is rounded up
// to 64 bytes and then to its size class (at most 12.5% more), and the
// size classes are the allocator's bins. When the rounded size is a
// multiple of 4096 the allocation is page aligned whenever a page-aligned
// range is free; every allocation is at least 64-byte aligned. A request
// larger than a slab takes ceil(n/SlabSize) contiguous whole slabs, first
// fit from the lowest address; slabs for small allocations are opened from
// the highest free slab down, which keeps long runs free. An emptied slab
// stays open for small allocations but counts as free and can be taken
// whole by a large allocation.
//
// Free takes the slice exactly as Alloc returned it (pointer, len and cap)
// and finds the allocation through a per-slab open-addressing table (16
// bytes per live allocation); a slice that is not a live allocation, for
// example a double free, gets ErrNotAllocated and changes nothing.
//
// # Concurrency
//
// All methods are safe for concurrent use. Each slab has its own mutex, so
// allocations in different slabs proceed in parallel; a request starts at
// the slab that last served its size class and skips slabs another
// goroutine holds before waiting on one. When every slab that could serve
// it is busy, it opens another free slab instead of waiting, as long as
// fewer than GOMAXPROCS and fewer than a quarter of all slabs are open. Slab state changes (opening a free
// slab, taking or releasing slabs for a large allocation) happen under one
// pool mutex (lock order: pool mutex, then slab mutexes by index). Before
// returning ErrOutOfMemory the pool holds its mutex and the locks of all
// open slabs, each of which has refused the request, while no slab is free:
// a failure is never spurious, even when many goroutines race to open the
// first slab. Steady-state Alloc and Free of sizes up to a slab do not
// allocate on the Go heap.
//
// Close unmaps the arena and closes the memfd; slices from the pool must not
// be used afterwards. There is deliberately no finalizer: slices into the
// arena do not keep the Pool reachable, so an automatic unmap could pull
// memory out from under live buffers. A pool that is never closed leaks its
// mapping.
//
// # Sharing memory with other processes
//
// Fd returns the arena's memfd, sealed against shrinking and growing
// (F_SEAL_SHRINK|F_SEAL_GROW) so that no process holding it can make the
// pool's own accesses fault. Another process that receives it (over a
// Unix socket with SCM_RIGHTS, or as an inherited file) maps it with Map
// and sees the same bytes at the same offsets; Pool.Offset and Lookup give
// a buffer's offset. Lookup answers, for any []byte, which open pool backs
// it, so the engine can hand same-host peers the fd and offset of any
// registered buffer.
//
// # Invariants build tag
//
// Built with -tags invariants, freed memory is filled with 0xdb and every
// allocator operation validates the slab allocator's structure.
package mempool
