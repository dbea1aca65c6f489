package mempool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// HugePageMode says which kind of huge pages back an arena.
type HugePageMode uint8

const (
	// HugePagesNone: normal pages (huge pages not asked for, or unavailable).
	HugePagesNone HugePageMode = iota
	// HugePagesHugeTLB: the memfd was created with MFD_HUGETLB from the
	// kernel's reserved pool (vm.nr_hugepages).
	HugePagesHugeTLB
	// HugePagesTHP: a normal memfd advised with MADV_HUGEPAGE, and the
	// kernel's shmem THP policy allows it; the kernel may still fall back to
	// small pages when it cannot find contiguous memory.
	HugePagesTHP
)

func (m HugePageMode) String() string {
	switch m {
	case HugePagesNone:
		return "none"
	case HugePagesHugeTLB:
		return "hugetlb"
	case HugePagesTHP:
		return "thp"
	}
	return "HugePageMode(" + strconv.Itoa(int(m)) + ")"
}

// PrefaultMode says how an arena was prefaulted.
type PrefaultMode uint8

const (
	// PrefaultNone: pages are faulted in on first touch.
	PrefaultNone PrefaultMode = iota
	// PrefaultPopulate: madvise(MADV_POPULATE_WRITE) (Linux 5.14+).
	PrefaultPopulate
	// PrefaultTouch: one atomic no-op write per page (older kernels).
	PrefaultTouch
)

func (m PrefaultMode) String() string {
	switch m {
	case PrefaultNone:
		return "none"
	case PrefaultPopulate:
		return "madvise-populate-write"
	case PrefaultTouch:
		return "touch"
	}
	return "PrefaultMode(" + strconv.Itoa(int(m)) + ")"
}

type arena struct {
	fd       int
	mem      []byte
	huge     HugePageMode
	hugeNote string
	prefault PrefaultMode
}

// newArena creates a memfd of size bytes (a multiple of align), maps it
// shared and read-write, and prefaults it unless told not to. With huge it
// tries MFD_HUGETLB first (size is then rounded up to the huge page size)
// and falls back to a normal memfd advised with MADV_HUGEPAGE.
func newArena(name string, size, align int64, huge, prefault bool, check func(int64) error) (*arena, error) {
	var notes []string
	if huge {
		hps := hugeTLBPageSize()
		hsize := roundUp(size, max(align, hps))
		a, err := mapNewMemfd(name, hsize, unix.MFD_HUGETLB)
		if err == nil {
			a.huge = HugePagesHugeTLB
			a.hugeNote = fmt.Sprintf("hugetlb, %d KiB pages", hps>>10)
			if prefault {
				if a.prefault, err = populate(a.mem, hps); err != nil {
					a.close()
					return nil, err
				}
			}
			return a, nil
		}
		notes = append(notes, "hugetlb unavailable: "+err.Error())
	}
	// hugetlb pages come from their reserved pool (mmap fails cleanly
	// when it is short); ordinary pages from MemAvailable, checked first.
	if err := check(size); err != nil {
		return nil, err
	}
	a, err := mapNewMemfd(name, size, 0)
	if err != nil {
		return nil, err
	}
	if huge {
		policy := shmemTHPPolicy()
		switch err := unix.Madvise(a.mem, unix.MADV_HUGEPAGE); {
		case err != nil:
			notes = append(notes, "MADV_HUGEPAGE: "+err.Error())
		case policy == "always" || policy == "within_size" || policy == "advise" || policy == "force":
			a.huge = HugePagesTHP
			notes = append(notes, "shmem THP policy "+policy)
		default:
			notes = append(notes, "shmem THP policy "+policy+" ignores MADV_HUGEPAGE")
		}
		a.hugeNote = strings.Join(notes, "; ")
	}
	if prefault {
		if a.prefault, err = populate(a.mem, int64(os.Getpagesize())); err != nil {
			a.close()
			return nil, err
		}
	}
	return a, nil
}

func mapNewMemfd(name string, size int64, flags int) (*arena, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|flags)
	if err != nil {
		return nil, fmt.Errorf("mempool: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mempool: ftruncate memfd to %d: %w", size, err)
	}
	// The arena never changes size; sealing it means a process we hand
	// the fd to cannot shrink it and make our own accesses fault.
	unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mempool: mmap %d bytes: %w", size, err)
	}
	return &arena{fd: fd, mem: mem}, nil
}

func (a *arena) close() error {
	err := unix.Munmap(a.mem)
	if cerr := unix.Close(a.fd); err == nil {
		err = cerr
	}
	return err
}

var populateUnsupported atomic.Bool

// populate faults every page of mem in for writing, so that no later access
// pays the (here very slow) first-touch cost. It never changes contents.
// Failing to get memory is an error rather than a later SIGBUS.
func populate(mem []byte, pageSize int64) (PrefaultMode, error) {
	for tries := 0; !populateUnsupported.Load(); tries++ {
		err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
		switch {
		case err == nil:
			return PrefaultPopulate, nil
		case errors.Is(err, unix.EINVAL):
			populateUnsupported.Store(true) // kernel older than 5.14
		case (errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN)) && tries < 10:
		default:
			return PrefaultNone, fmt.Errorf("mempool: prefault %d bytes: %w", len(mem), err)
		}
	}
	for i := int64(0); i < int64(len(mem)); i += pageSize {
		// An atomic add of zero writes without racing with other users of
		// a shared mapping.
		atomic.AddUint32((*uint32)(unsafe.Pointer(&mem[i])), 0)
	}
	return PrefaultTouch, nil
}

var hugeTLBSize = sync.OnceValue(func() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err == nil {
		for line := range bytes.Lines(b) {
			if f := strings.Fields(string(line)); len(f) == 3 && f[0] == "Hugepagesize:" && f[2] == "kB" {
				if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil && kb > 0 {
					return kb << 10
				}
			}
		}
	}
	return 2 << 20
})

func hugeTLBPageSize() int64 { return hugeTLBSize() }

// shmemTHPPolicy returns the kernel's THP policy for shmem (memfd) at the
// PMD size: the per-size setting unless it says "inherit", else the global
// one; "unknown" when sysfs does not say.
func shmemTHPPolicy() string {
	const dir = "/sys/kernel/mm/transparent_hugepage/"
	if b, err := os.ReadFile(dir + "hpage_pmd_size"); err == nil {
		if sz, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			p := selected(dir + "hugepages-" + strconv.FormatInt(sz>>10, 10) + "kB/shmem_enabled")
			if p != "" && p != "inherit" {
				return p
			}
		}
	}
	if p := selected(dir + "shmem_enabled"); p != "" {
		return p
	}
	return "unknown"
}

// selected returns the bracketed word of a sysfs choice file.
func selected(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := string(b)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return ""
	}
	return s[i+1 : j]
}

// MapOptions configures Map.
type MapOptions struct {
	// Prefault faults the whole mapping in at once (MADV_POPULATE_WRITE,
	// else a touch per page). Contents are not changed.
	Prefault bool
	// ReadOnly maps with PROT_READ only.
	ReadOnly bool
}

// Mapping is a shared mapping of a memfd received from elsewhere (for
// example a Pool's Fd passed over a Unix socket or to a child process).
type Mapping struct {
	mu  sync.Mutex
	mem []byte
}

// Map maps the first size bytes of fd MAP_SHARED. fd is not consumed: the
// caller may close it right after Map returns; the mapping keeps the memory
// alive until Close. size must be positive and not exceed the file's size.
func Map(fd int, size int64, opts MapOptions) (*Mapping, error) {
	if size <= 0 || size > int64(^uint(0)>>1) {
		return nil, fmt.Errorf("%w: mapping size %d", ErrInvalidSize, size)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("mempool: fstat fd %d: %w", fd, err)
	}
	if st.Size < size {
		return nil, fmt.Errorf("%w: mapping %d bytes of a %d-byte file", ErrInvalidSize, size, st.Size)
	}
	prot := unix.PROT_READ | unix.PROT_WRITE
	if opts.ReadOnly {
		prot = unix.PROT_READ
	}
	mem, err := unix.Mmap(fd, 0, int(size), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mempool: mmap fd %d: %w", fd, err)
	}
	if opts.Prefault {
		if opts.ReadOnly {
			_ = unix.Madvise(mem, unix.MADV_POPULATE_READ) // best effort
		} else if _, err := populate(mem, int64(os.Getpagesize())); err != nil {
			unix.Munmap(mem)
			return nil, err
		}
	}
	return &Mapping{mem: mem}, nil
}

// Bytes returns the mapped memory; nil after Close.
func (m *Mapping) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mem
}

// Close unmaps the memory. Slices obtained from Bytes must not be used
// afterwards. Calling Close again does nothing.
func (m *Mapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mem == nil {
		return nil
	}
	err := unix.Munmap(m.mem)
	m.mem = nil
	if err != nil {
		return fmt.Errorf("mempool: munmap: %w", err)
	}
	return nil
}

func roundUp(x, a int64) int64 { return (x + a - 1) / a * a }
