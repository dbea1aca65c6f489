package fabric

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Errors of the package. Provider failures are typed (Errno, *CQError).
var (
	// ErrNotSupported means libfabric cannot be used here: the package was
	// built without the fabric tag or cgo, or the library cannot be loaded.
	ErrNotSupported = errors.New("fabric: libfabric not available")
	// ErrNoProvider means no provider offers RDM endpoints with RMA.
	ErrNoProvider = errors.New("fabric: no provider offers RDM endpoints with RMA")
	// ErrClosed is returned by calls on a closed endpoint or MR.
	ErrClosed = errors.New("fabric: closed")
	// ErrNoReset means the endpoint cannot be replaced (its provider binds
	// memory registrations to the endpoint: FI_MR_ENDPOINT).
	ErrNoReset = errors.New("fabric: endpoint reset not possible with FI_MR_ENDPOINT")
)

// Errno is a libfabric error code (FI_E*, positive; the values below 256
// are errno values).
type Errno int

// Codes the transport acts on.
const (
	EAGAIN       Errno = Errno(unix.EAGAIN)
	ECANCELED    Errno = Errno(unix.ECANCELED)
	ENOTCONN     Errno = Errno(unix.ENOTCONN)
	ECONNRESET   Errno = Errno(unix.ECONNRESET)
	ECONNABORTED Errno = Errno(unix.ECONNABORTED)
	ECONNREFUSED Errno = Errno(unix.ECONNREFUSED)
	EPIPE        Errno = Errno(unix.EPIPE)
	EHOSTUNREACH Errno = Errno(unix.EHOSTUNREACH)
	ENETUNREACH  Errno = Errno(unix.ENETUNREACH)
	ETIMEDOUT    Errno = Errno(unix.ETIMEDOUT)
	ENODATA      Errno = Errno(unix.ENODATA)
	ENOKEY       Errno = 266 // FI_ENOKEY
)

// fiErrors are libfabric's own codes (FI_ERRNO_OFFSET = 256 and up), as
// fi_strerror words them.
var fiErrors = map[Errno]string{
	256: "Unspecified error",
	257: "Provided buffer is too small",
	258: "Operation not permitted in current state",
	259: "Error available",
	260: "Flags not supported",
	261: "Missing or unavailable event queue",
	262: "Invalid resource domain",
	263: "Missing or unavailable completion queue",
	264: "CRC error",
	265: "Truncation error",
	266: "Required key not available",
	267: "Missing or unavailable address vector",
	268: "Queue has been overrun",
}

func (e Errno) Error() string {
	if e > 0 && e < 256 {
		return unix.Errno(e).Error()
	}
	if s, ok := fiErrors[e]; ok {
		return s
	}
	return "fabric error " + strconv.Itoa(int(e))
}

// Is lets errors.Is match an Errno against the unix.Errno of the same
// value.
func (e Errno) Is(target error) bool {
	var u unix.Errno
	if errors.As(target, &u) {
		return int(u) == int(e)
	}
	return false
}

// CQError is a failed operation as its completion queue reported it.
type CQError struct {
	Errno     Errno  // the generic code
	ProvErrno int    // the provider's own code
	ProvMsg   string // fi_cq_strerror: the provider's text
}

func (e *CQError) Error() string {
	if e.ProvMsg == "" {
		return fmt.Sprintf("fabric: %v (provider errno %d)", e.Errno, e.ProvErrno)
	}
	return fmt.Sprintf("fabric: %v (provider: %s)", e.Errno, e.ProvMsg)
}

func (e *CQError) Unwrap() error { return e.Errno }

// MRMode is a domain's memory-registration mode bits (FI_MR_*).
type MRMode uint64

// The mode bits this package honours.
const (
	MRLocal     MRMode = 1 << 2 // local buffers need a registration
	MRVirtAddr  MRMode = 1 << 4 // remote addresses are virtual addresses, else offsets into the MR
	MRAllocated MRMode = 1 << 5 // registered memory must be backed
	MRProvKey   MRMode = 1 << 6 // the provider picks the keys
	MREndpoint  MRMode = 1 << 9 // registrations are bound to the endpoint
)

func (m MRMode) String() string {
	s := ""
	for _, b := range []struct {
		bit  MRMode
		name string
	}{{MRLocal, "local"}, {MRVirtAddr, "virt_addr"}, {MRAllocated, "allocated"}, {MRProvKey, "prov_key"}, {MREndpoint, "endpoint"}} {
		if m&b.bit != 0 {
			if s != "" {
				s += "|"
			}
			s += b.name
		}
	}
	if s == "" {
		return "none"
	}
	return s
}

// Progress is a domain's data progress model.
type Progress int

// Data progress models (FI_PROGRESS_*).
const (
	ProgressUnspec Progress = 0
	ProgressAuto   Progress = 1 // the provider moves data without calls
	ProgressManual Progress = 2 // data moves only while the application calls in (CQ reads)
)

// Info describes one domain (NIC) of a provider offering RDM endpoints
// with RMA.
type Info struct {
	Provider   string // "efa", "tcp;ofi_rxm", "sockets", ...
	Fabric     string
	Domain     string // the NIC: "rdmap16s27-rdm", "eth0", "lo"
	MRMode     MRMode
	MaxMsgSize uint64
	TxSize     int
	RxSize     int
	Progress   Progress
	// Loopback is set when the domain's source address is 127/8 or ::1.
	Loopback   bool
	AddrFormat int
	SrcAddr    []byte
	// DeliveryComplete is set when writes complete only once the data is
	// placed in target memory (FI_DELIVERY_COMPLETE); otherwise the
	// provider's default completion applies.
	DeliveryComplete bool
}

// Options size an endpoint. Zero values take the defaults.
type Options struct {
	// TxSize is the transmit queue depth asked of the provider (0 = its
	// default).
	TxSize int
	// Slots bounds operations in flight (default: the provider's transmit
	// depth, at most 4096).
	Slots int
	// MaxBatch bounds operations per Progress call (default 256).
	MaxBatch int
	// MaxCompletions bounds completions read per Progress call (default
	// 256).
	MaxCompletions int
	// AVCount sizes the address vector (default 1024; it grows if the
	// provider allows).
	AVCount int
	// WaitFD opens the completion queue with a wait fd when the provider
	// offers one.
	WaitFD bool
}

func (o *Options) setDefaults(info Info) {
	if o.Slots <= 0 {
		o.Slots = info.TxSize
		if o.Slots <= 0 {
			o.Slots = 256
		}
	}
	o.Slots = min(o.Slots, 4096)
	if o.MaxBatch <= 0 {
		o.MaxBatch = 256
	}
	if o.MaxCompletions <= 0 {
		o.MaxCompletions = 256
	}
	if o.AVCount <= 0 {
		o.AVCount = 1024
	}
}

// Addr is a peer's index in an endpoint's address vector (fi_addr_t).
type Addr uint64

// Op is one RMA operation for Progress.
type Op struct {
	Write  bool   // write Local to the peer, else read into Local
	Local  []byte // registered local memory
	MR     *MR    // Local's registration on this endpoint's domain
	Peer   Addr
	Remote uint64 // remote address (virtual, or offset into the MR)
	Key    uint64 // remote key
	Slot   uint32 // the caller's identifier, < Endpoint.Slots(); reported by the completion

	// Err is set by Progress for the ops it attempted: nil when posted,
	// an Errno when the provider refused the operation.
	Err error
}

// Completion is the outcome of one posted operation.
type Completion struct {
	Slot uint32 // NoSlot when the provider reported an error tied to no operation
	Err  error  // nil, or a *CQError
}

// NoSlot marks a completion that belongs to no operation.
const NoSlot = ^uint32(0)

// Result sums up one Progress call.
type Result struct {
	// Attempted ops have Err set; ops[Attempted:] were not posted (the
	// queue was full: try them again later).
	Attempted int
	Posted    int
	// EAGAIN counts the provider's "queue full" answers in this call.
	EAGAIN int
	// MayWait is set when nothing happened and fi_trywait allows waiting
	// on the wait fd.
	MayWait bool
}

// Stats are process-wide counters.
type Stats struct {
	// Calls counts every crossing into C.
	Calls uint64
	// ProgressCalls counts Progress crossings (posting and reading
	// completions in one call); PostCalls those that had ops to post.
	ProgressCalls uint64
	PostCalls     uint64
	Posted        uint64
	Completions   uint64
	EAGAIN        uint64
	AVInserts     uint64
	MRs           uint64
}

var stats struct {
	calls, progress, postCalls, posted, completions, eagain, avInserts, mrs atomic.Uint64
}

// ReadStats returns the process-wide counters.
func ReadStats() Stats {
	return Stats{
		Calls: stats.calls.Load(), ProgressCalls: stats.progress.Load(), PostCalls: stats.postCalls.Load(), Posted: stats.posted.Load(),
		Completions: stats.completions.Load(), EAGAIN: stats.eagain.Load(), AVInserts: stats.avInserts.Load(), MRs: stats.mrs.Load(),
	}
}

// Sub returns s - o, counter by counter.
func (s Stats) Sub(o Stats) Stats {
	return Stats{
		Calls: s.Calls - o.Calls, ProgressCalls: s.ProgressCalls - o.ProgressCalls, PostCalls: s.PostCalls - o.PostCalls, Posted: s.Posted - o.Posted,
		Completions: s.Completions - o.Completions, EAGAIN: s.EAGAIN - o.EAGAIN, AVInserts: s.AVInserts - o.AVInserts, MRs: s.MRs - o.MRs,
	}
}

// EnvLibrary names the environment variable that overrides the library
// path (the reference's name).
const EnvLibrary = "MC_LIBFABRIC_PATH"

// DefaultLibraries are tried in order when no path is given.
var DefaultLibraries = []string{"libfabric.so.1", "/opt/amazon/efa/lib/libfabric.so.1"}
