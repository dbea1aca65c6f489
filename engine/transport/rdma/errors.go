package rdma

import (
	"errors"
	"fmt"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// Errors of the RDMA transport.
var (
	ErrConfig = errors.New("rdma: invalid configuration")
	// ErrNoDevices reports a host without usable RDMA NICs; it wraps
	// transport.ErrNotSupported so the engine skips the transport
	// quietly.
	ErrNoDevices = fmt.Errorf("rdma: no usable RDMA devices: %w", transport.ErrNotSupported)
	// ErrHandshake reports an endpoint handshake the peer refused or
	// answered badly.
	ErrHandshake = errors.New("rdma: endpoint handshake failed")
	// ErrNoPath reports a slice for which every (local NIC, peer NIC)
	// pair is paused or down.
	ErrNoPath = errors.New("rdma: no usable NIC pair (paused after errors or port down)")
	// ErrPeerDescriptor reports a peer descriptor the transport cannot
	// use (no rdma devices, keys of another transport).
	ErrPeerDescriptor = errors.New("rdma: peer descriptor has no usable rdma devices")
)

// CompletionError is a work completion that ended in error. It unwraps
// to the transport error class the engine reports: a remote access or
// invalid request error to transport.ErrRejected, a transport retry
// failure to transport.ErrPeerGone, anything else to
// transport.ErrProtocol.
type CompletionError struct {
	Status    rdmadev.WCStatus
	VendorErr uint32
	Op        rdmadev.Opcode
	Local     string // local NIC path
	Peer      string // peer NIC path
	Remote    uint64 // remote address of the slice
}

func (e *CompletionError) Error() string {
	return fmt.Sprintf("rdma: %v %#x on %s -> %s: %v (vendor error %#x)", e.Op, e.Remote, e.Local, e.Peer, e.Status, e.VendorErr)
}

func (e *CompletionError) Unwrap() error {
	switch e.Status {
	case rdmadev.WCRemAccessErr, rdmadev.WCRemInvReqErr, rdmadev.WCRemOpErr, rdmadev.WCRemInvRDReqErr:
		return transport.ErrRejected
	case rdmadev.WCRetryExcErr, rdmadev.WCRNRRetryExcErr, rdmadev.WCRespTimeoutErr:
		return transport.ErrPeerGone
	}
	return transport.ErrProtocol
}

// requestError reports statuses caused by the request itself (keys,
// bounds, access): sending it again elsewhere cannot help, and the path
// is not to blame.
func requestError(s rdmadev.WCStatus) bool {
	switch s {
	case rdmadev.WCRemAccessErr, rdmadev.WCRemInvReqErr, rdmadev.WCLocProtErr, rdmadev.WCLocLenErr, rdmadev.WCLocAccessErr, rdmadev.WCMWBindErr:
		return true
	}
	return false
}
