package rdmadev

import (
	"context"
	"errors"
	"fmt"
)

// Errors shared by device implementations.
var (
	// ErrNotSupported reports that no device layer is available here (no
	// libibverbs, a build without the verbs tag, or no devices).
	ErrNotSupported = errors.New("rdmadev: RDMA devices not available")
	// ErrClosed reports use of a closed object.
	ErrClosed = errors.New("rdmadev: closed")
	// ErrQueueFull reports a PostSend beyond the send queue's capacity
	// (ENOMEM from a real HCA); the WRs before it were posted.
	ErrQueueFull = errors.New("rdmadev: send queue full")
	// ErrBadState reports a QP transition or post not allowed in the
	// QP's current state (EINVAL from a real HCA).
	ErrBadState = errors.New("rdmadev: operation not allowed in this QP state")
	// ErrInvalid reports a bad argument (bad MTU, unknown port, ...).
	ErrInvalid = errors.New("rdmadev: invalid argument")
	// ErrCQOverrun reports a completion queue that overflowed; it is
	// unusable afterwards, as on a real HCA.
	ErrCQOverrun = errors.New("rdmadev: completion queue overrun")
)

// Device is one RDMA NIC. Implementations: internal/verbs (libibverbs)
// and engine/transport/rdma/soft (software, over local memory).
//
// Every method may be a cgo crossing on real hardware; the hot ones
// (QP.PostSend, CQ.Poll, CQ.Arm, CQ.Wait) take batches.
type Device interface {
	// Info describes the device as discovered.
	Info() DeviceInfo
	// QueryPort reads the current attributes of a port (state changes
	// when a link goes down).
	QueryPort(port uint8) (PortInfo, error)
	// AllocPD allocates a protection domain.
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue holding depth entries, with
	// its own completion channel for CQ.Wait.
	CreateCQ(depth int) (CQ, error)
	// Close releases the device. Objects created from it must be closed
	// first.
	Close() error
}

// DeviceInfo is what discovery learns about a NIC.
type DeviceInfo struct {
	Name string
	// NUMANode is the NIC's node (sysfs device/numa_node); -1 if unknown.
	NUMANode int
	// Ports lists the device's ports, numbered from 1.
	Ports []PortInfo
}

// PortState is ibv_port_state.
type PortState int

// Port states, with libibverbs' values.
const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortNop:
		return "NOP"
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case PortActiveDefer:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", int(s))
}

// LinkLayer is the port's link layer (IBV_LINK_LAYER_*).
type LinkLayer int

// Link layers, with libibverbs' values.
const (
	LinkUnspecified LinkLayer = 0
	LinkInfiniBand  LinkLayer = 1
	LinkEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkInfiniBand:
		return "InfiniBand"
	case LinkEthernet:
		return "Ethernet"
	}
	return "unspecified"
}

// PortInfo describes one port and the GID chosen on it.
type PortInfo struct {
	Num       uint8
	State     PortState
	LID       uint16
	LinkLayer LinkLayer
	ActiveMTU MTU
	MaxMTU    MTU
	// GIDIndex is the GID table entry used as source GID; GID its value.
	GIDIndex int
	GID      GID
}

// Access is a set of ibv_access_flags.
type Access uint32

// Access flags, with libibverbs' values.
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 2
	AccessRemoteRead   Access = 4
	AccessRemoteAtomic Access = 8
)

// PD is a protection domain: MRs and QPs of one PD may work together.
type PD interface {
	// RegMR registers mem (which must stay mapped until MR.Close) for
	// the given access.
	RegMR(mem []byte, access Access) (MR, error)
	// CreateQP creates an RC QP in state RESET whose send and receive
	// completions go to cq.
	CreateQP(cq CQ, caps QPCaps) (QP, error)
	Close() error
}

// MR is a registered memory region.
type MR interface {
	LKey() uint32
	RKey() uint32
	// Close deregisters the region; after it returns the device no
	// longer touches the memory.
	Close() error
}

// QPCaps sizes a QP (ibv_qp_cap).
type QPCaps struct {
	MaxSendWR, MaxRecvWR   int
	MaxSendSGE, MaxRecvSGE int
	MaxInline              int
}

// QPState is ibv_qp_state.
type QPState int

// QP states, with libibverbs' values.
const (
	QPReset QPState = 0
	QPInit  QPState = 1
	QPRTR   QPState = 2
	QPRTS   QPState = 3
	QPSQD   QPState = 4
	QPSQE   QPState = 5
	QPError QPState = 6
)

func (s QPState) String() string {
	switch s {
	case QPReset:
		return "RESET"
	case QPInit:
		return "INIT"
	case QPRTR:
		return "RTR"
	case QPRTS:
		return "RTS"
	case QPSQD:
		return "SQD"
	case QPSQE:
		return "SQE"
	case QPError:
		return "ERR"
	}
	return fmt.Sprintf("QPState(%d)", int(s))
}

// RTRAttr is what RESET→INIT→RTR needs to know about the peer.
type RTRAttr struct {
	Port      uint8
	PathMTU   MTU
	DestQPN   uint32
	DestLID   uint16
	DestGID   GID
	SGIDIndex int
	// Global forces a GRH (always on RoCE; on IB when GIDs route).
	Global          bool
	HopLimit        uint8
	RQPSN           uint32
	MaxDestRdAtomic uint8
	MinRNRTimer     uint8
}

// RTSAttr is what RTR→RTS needs.
type RTSAttr struct {
	Timeout     uint8
	RetryCount  uint8
	RNRRetry    uint8
	SQPSN       uint32
	MaxRdAtomic uint8
}

// QP is a reliable-connected queue pair.
type QP interface {
	// Num is the QP number peers connect to.
	Num() uint32
	// ToInit moves RESET→INIT on port with the given remote access.
	ToInit(port uint8, access Access) error
	// ToRTR moves INIT→RTR, connecting to the peer QP.
	ToRTR(a RTRAttr) error
	// ToRTS moves RTR→RTS; the QP may then post sends.
	ToRTS(a RTSAttr) error
	// SetError moves the QP to ERR: every outstanding WR completes with
	// WCWRFlushErr.
	SetError() error
	// Reset moves the QP to RESET: outstanding WRs are dropped without
	// completions, and the device stops touching their memory before
	// Reset returns.
	Reset() error
	// State reports the QP's state.
	State() (QPState, error)
	// PostSend posts wrs in order, in one call. It returns how many were
	// posted; on an error the WRs from index n on were not.
	PostSend(wrs []SendWR) (n int, err error)
	// Close destroys the QP (implies Reset).
	Close() error
}

// Opcode is a work request's operation (ibv_wr_opcode values).
type Opcode uint8

// Opcodes used here.
const (
	OpWrite Opcode = 0 // IBV_WR_RDMA_WRITE
	OpRead  Opcode = 4 // IBV_WR_RDMA_READ
)

func (o Opcode) String() string {
	switch o {
	case OpWrite:
		return "RDMA_WRITE"
	case OpRead:
		return "RDMA_READ"
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// SendWR is one signaled one-sided work request with one SGE.
type SendWR struct {
	ID     uint64
	Op     Opcode
	Local  uint64 // local virtual address
	Length uint32
	LKey   uint32
	Remote uint64 // remote virtual address
	RKey   uint32
}

// WCStatus is ibv_wc_status.
type WCStatus int

// Work completion statuses, with libibverbs' values.
const (
	WCSuccess          WCStatus = 0
	WCLocLenErr        WCStatus = 1
	WCLocQPOpErr       WCStatus = 2
	WCLocEECOpErr      WCStatus = 3
	WCLocProtErr       WCStatus = 4
	WCWRFlushErr       WCStatus = 5
	WCMWBindErr        WCStatus = 6
	WCBadRespErr       WCStatus = 7
	WCLocAccessErr     WCStatus = 8
	WCRemInvReqErr     WCStatus = 9
	WCRemAccessErr     WCStatus = 10
	WCRemOpErr         WCStatus = 11
	WCRetryExcErr      WCStatus = 12
	WCRNRRetryExcErr   WCStatus = 13
	WCLocRDDViolErr    WCStatus = 14
	WCRemInvRDReqErr   WCStatus = 15
	WCRemAbortErr      WCStatus = 16
	WCInvEECNErr       WCStatus = 17
	WCInvEECStateErr   WCStatus = 18
	WCFatalErr         WCStatus = 19
	WCRespTimeoutErr   WCStatus = 20
	WCGeneralErr       WCStatus = 21
	WCTMErr            WCStatus = 22
	WCTMRndvIncomplete WCStatus = 23
)

var wcNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error", "remote access error",
	"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout error", "general error",
	"TM error", "TM software rendezvous",
}

// String is ibv_wc_status_str's text.
func (s WCStatus) String() string {
	if s >= 0 && int(s) < len(wcNames) {
		return wcNames[s]
	}
	return fmt.Sprintf("unknown WC status %d", int(s))
}

// Completion is one work completion (the fields of ibv_wc used here).
type Completion struct {
	ID        uint64
	Status    WCStatus
	Op        Opcode // the WR's opcode (translated from ibv_wc_opcode)
	Bytes     uint32
	QPN       uint32
	VendorErr uint32
}

// CQ is a completion queue with a completion channel.
type CQ interface {
	// Poll moves up to len(out) completions into out, without waiting.
	Poll(out []Completion) (int, error)
	// Arm requests one event for the next completion added to the CQ.
	// Completions already queued raise none: poll again after arming.
	Arm() error
	// Wait returns once an armed event fired, or with ctx's error. It
	// never blocks inside C (real devices wait on the channel fd through
	// the Go netpoller).
	Wait(ctx context.Context) error
	Close() error
}
