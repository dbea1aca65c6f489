package engine

import (
	"errors"
	"fmt"
)

// Sentinel errors. Use errors.Is; the returned errors wrap them with
// detail.
var (
	ErrClosed            = errors.New("engine: closed")
	ErrSegmentNotFound   = errors.New("engine: segment not found")
	ErrInvalidSegment    = errors.New("engine: unknown or closed segment handle")
	ErrInvalidBatch      = errors.New("engine: unknown or freed batch handle")
	ErrBatchBusy         = errors.New("engine: batch has requests in flight")
	ErrBatchFull         = errors.New("engine: batch capacity exceeded")
	ErrInvalidCapacity   = errors.New("engine: batch capacity must be positive")
	ErrInvalidIndex      = errors.New("engine: request index out of range")
	ErrNotRegistered     = errors.New("engine: local memory not registered")
	ErrAlreadyRegistered = errors.New("engine: memory overlaps a registered buffer")
	ErrOutOfBounds       = errors.New("engine: target range not in a registered buffer of the segment")
	ErrZeroLength        = errors.New("engine: zero-length request")
	ErrLengthOverflow    = errors.New("engine: target address + length overflows")
	ErrInvalidOp         = errors.New("engine: invalid opcode")
	ErrNoTransport       = errors.New("engine: no transport can reach the target")
	ErrInvalidConfig     = errors.New("engine: invalid configuration")
	ErrUnregisterBusy    = errors.New("engine: buffer still in use by transfers")
	ErrQuarantined       = errors.New("engine: buffer quarantined: a peer did not confirm it stopped using it")
	// ErrTransportUninstalled: the transport is not running (never
	// installed, or UninstallTransport stopped it).
	ErrTransportUninstalled = errors.New("engine: transport not installed")
)

// QuarantineError is UnregisterMemory's answer when a peer did not
// confirm it stopped using a buffer: the buffer is hidden from new
// requests, and its memory must not be freed or reused until Released
// closes (the peer's connection is gone and no transfer touches it).
type QuarantineError struct {
	Addr, Len uint64
	Err       error // what the transports reported
	Released  <-chan struct{}
}

func (e *QuarantineError) Error() string {
	return fmt.Sprintf("%v: [%#x,+%d): %v", ErrQuarantined, e.Addr, e.Len, e.Err)
}

// Is makes errors.Is(err, ErrQuarantined) true.
func (e *QuarantineError) Is(target error) bool { return target == ErrQuarantined }

func (e *QuarantineError) Unwrap() error { return e.Err }

// RequestError says which request of a Submit call was refused.
type RequestError struct {
	Index int
	Err   error
}

func (e *RequestError) Error() string { return fmt.Sprintf("request %d: %v", e.Index, e.Err) }
func (e *RequestError) Unwrap() error { return e.Err }
