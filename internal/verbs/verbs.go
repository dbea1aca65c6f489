package verbs

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// unavailable is an error meaning "RDMA is not usable here"; it matches
// rdmadev.ErrNotSupported.
type unavailable struct{ msg string }

func (e *unavailable) Error() string        { return e.msg }
func (e *unavailable) Is(target error) bool { return target == rdmadev.ErrNotSupported }

var (
	// ErrUnavailable reports that libibverbs cannot be used: a build
	// without cgo or the verbs tag, or a library that does not load.
	ErrUnavailable error = &unavailable{"verbs: libibverbs not available"}
	// ErrNoDevices reports a loaded library that lists no usable RDMA
	// device (the case on a host without an RDMA NIC).
	ErrNoDevices error = &unavailable{"verbs: no RDMA devices"}
)

// DefaultLibrary is the file dlopen'ed when Load gets "".
const DefaultLibrary = "libibverbs.so.1"

// Options select and configure discovered devices.
type Options struct {
	// Names keeps only these devices (all when empty).
	Names []string
	// Port restricts each device to this port (all ports when 0).
	Port uint8
	// GIDIndex > 0 forces that GID table entry; 0 chooses (see
	// ChooseGID).
	GIDIndex int
	// SysfsRoot is where sysfs is mounted (default "/sys").
	SysfsRoot string
}

// Counts are the cgo crossings made by this package, by kind. With real
// hardware every data-path call is one crossing: Post per batch of work
// requests, Poll per batch of completions, Arm and Event per wait.
type Counts struct {
	Post, Poll, Arm, Event, Control uint64
}

// Total is the sum of all crossings.
func (c Counts) Total() uint64 { return c.Post + c.Poll + c.Arm + c.Event + c.Control }

var crossings struct {
	post, poll, arm, event, control atomic.Uint64
}

// Crossings returns the crossings made so far by the process.
func Crossings() Counts {
	return Counts{Post: crossings.post.Load(), Poll: crossings.poll.Load(), Arm: crossings.arm.Load(),
		Event: crossings.event.Load(), Control: crossings.control.Load()}
}

// GIDEntry is one GID table entry as discovery sees it.
type GIDEntry struct {
	Index int
	GID   rdmadev.GID
	// Type is sysfs gid_attrs/types/<index>: "IB/RoCE v1", "RoCE v2"
	// or "" when unknown.
	Type string
}

// ChooseGID picks the source GID index for a port: on InfiniBand the
// first non-zero entry (normally 0); on Ethernet (RoCE) a RoCE v2 entry
// holding an IPv4-mapped address first (routable, and what the
// reference's users configure), then any RoCE v2 entry, then any
// non-zero one. It returns -1 when the table holds no usable GID.
func ChooseGID(ll rdmadev.LinkLayer, entries []GIDEntry) int {
	pick := func(ok func(e GIDEntry) bool) int {
		for _, e := range entries {
			if !e.GID.IsZero() && ok(e) {
				return e.Index
			}
		}
		return -1
	}
	if ll == rdmadev.LinkEthernet {
		if i := pick(func(e GIDEntry) bool { return e.Type == "RoCE v2" && e.GID.IPv4Mapped() }); i >= 0 {
			return i
		}
		if i := pick(func(e GIDEntry) bool { return e.Type == "RoCE v2" }); i >= 0 {
			return i
		}
	}
	return pick(func(GIDEntry) bool { return true })
}

// NUMANode reads /sys/class/infiniband/<dev>/device/numa_node; -1 when
// absent or unknown.
func NUMANode(sysfs, dev string) int {
	b, err := os.ReadFile(filepath.Join(sysfs, "class/infiniband", dev, "device/numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// gidType reads the sysfs type of a GID table entry ("" if unknown).
func gidType(sysfs, dev string, port uint8, index int) string {
	b, err := os.ReadFile(filepath.Join(sysfs, "class/infiniband", dev, "ports", strconv.Itoa(int(port)), "gid_attrs/types", strconv.Itoa(index)))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// wcOpcode translates an ibv_wc_opcode into the work request's opcode.
func wcOpcode(op uint32) rdmadev.Opcode {
	switch op {
	case 1: // IBV_WC_RDMA_WRITE
		return rdmadev.OpWrite
	case 2: // IBV_WC_RDMA_READ
		return rdmadev.OpRead
	}
	return rdmadev.Opcode(0xff)
}

// clampAtomic bounds a QP's outstanding RDMA reads by the device limit
// (0 means unknown: keep the request).
func clampAtomic(want uint8, limit int) uint8 {
	if limit > 0 && int(want) > limit {
		return uint8(limit)
	}
	return want
}
