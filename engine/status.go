package engine

import (
	"time"

	"github.com/crescent-kv/crescent/engine/transport"
)

// OpCode is the direction of a request, seen from the initiator.
type OpCode = transport.Op

const (
	// Read copies target memory into local memory.
	Read = transport.Read
	// Write copies local memory into target memory.
	Write = transport.Write
)

// Status is the state of a request or a batch. The numeric values are the
// reference engine's (TransferStatusEnum).
type Status uint8

const (
	Waiting   Status = 0 // not submitted
	Pending   Status = 1 // submitted, not finished
	Invalid   Status = 2 // never used for a live request; kept for the enum's shape
	Canceled  Status = 3
	Completed Status = 4
	Timeout   Status = 5
	Failed    Status = 6
)

func (s Status) String() string {
	switch s {
	case Waiting:
		return "WAITING"
	case Pending:
		return "PENDING"
	case Invalid:
		return "INVALID"
	case Canceled:
		return "CANCELED"
	case Completed:
		return "COMPLETED"
	case Timeout:
		return "TIMEOUT"
	case Failed:
		return "FAILED"
	}
	return "UNKNOWN"
}

// Final reports whether s is a terminal state.
func (s Status) Final() bool {
	return s == Canceled || s == Completed || s == Timeout || s == Failed
}

// Request is one READ or WRITE. Local must lie in registered memory; its
// length is the transfer length. TargetAddr is the remote virtual address
// of the bytes in the target segment (an offset for CXL segments).
type Request struct {
	Op         OpCode
	Local      []byte
	Target     SegmentID
	TargetAddr uint64
}

// TransferStatus is the state of one request.
type TransferStatus struct {
	Status      Status
	Transferred uint64
	// Err says why a request ended FAILED, TIMEOUT or CANCELED.
	Err error
	// Latency is the time from Submit to the end of the request.
	Latency time.Duration
}

// BatchStatus summarises a batch. Status is PENDING while any request is
// pending, COMPLETED when all completed, otherwise the first of FAILED,
// TIMEOUT, CANCELED present. A batch with no requests is WAITING.
type BatchStatus struct {
	Status      Status
	Requests    int
	Completed   int
	Failed      int
	TimedOut    int
	Canceled    int
	Pending     int
	Transferred uint64
	// Err is the first error among the requests.
	Err error
	// NotifyErr is set when the batch's notification could not be
	// delivered.
	NotifyErr error
}
