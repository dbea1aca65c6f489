package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/cxl"
	"github.com/crescent-kv/crescent/internal/logx"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/local"
)

// Engine codes: Mooncake transfer engine error.h, plus Crescent's
// quarantine (-9). Keep in step with include/crescent.h.
const (
	errInvalidArgument      = -1
	errTooManyRequests      = -2
	errAddressNotRegistered = -3
	errBatchBusy            = -4
	errAddressOverlapped    = -7
	errQuarantined          = -9
	errDNS                  = -101
	errSocket               = -102
	errMetadata             = -200
	errEndpoint             = -201
	errContext              = -202
	errMemory               = -302
	errNotImpl              = -303
)

// errBadHandle: a handle that names no live object of the wanted kind.
var errBadHandle = errors.New("crescent: unknown or destroyed handle")

// errNoMemory: C.malloc failed.
var errNoMemory = errors.New("crescent: out of memory")

// argError is a bad argument found by the ABI layer itself.
type argError struct{ msg string }

func (e *argError) Error() string { return "crescent: " + e.msg }

func badArg(msg string) error { return &argError{msg} }

// engineCode maps an engine error to its code.
func engineCode(err error) int {
	var dns *net.DNSError
	var ae *argError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errBadHandle), errors.As(err, &ae),
		errors.Is(err, engine.ErrInvalidBatch), errors.Is(err, engine.ErrInvalidSegment),
		errors.Is(err, engine.ErrInvalidCapacity), errors.Is(err, engine.ErrInvalidIndex),
		errors.Is(err, engine.ErrZeroLength), errors.Is(err, engine.ErrLengthOverflow),
		errors.Is(err, engine.ErrInvalidOp), errors.Is(err, engine.ErrInvalidConfig),
		errors.Is(err, engine.ErrOutOfBounds):
		return errInvalidArgument
	case errors.Is(err, engine.ErrBatchFull):
		return errTooManyRequests
	case errors.Is(err, engine.ErrNotRegistered):
		return errAddressNotRegistered
	case errors.Is(err, engine.ErrBatchBusy), errors.Is(err, engine.ErrUnregisterBusy):
		return errBatchBusy
	case errors.Is(err, engine.ErrAlreadyRegistered):
		return errAddressOverlapped
	case errors.Is(err, engine.ErrQuarantined):
		return errQuarantined
	case errors.Is(err, engine.ErrSegmentNotFound):
		return errMetadata
	case errors.Is(err, engine.ErrNoTransport):
		return errEndpoint
	case errors.Is(err, engine.ErrTransportUninstalled):
		return errInvalidArgument // uninstalling one not running
	case errors.Is(err, transport.ErrNotSupported), errors.Is(err, cxl.ErrNoDevice):
		return errNotImpl // a transport this host or build cannot run
	case errors.Is(err, engine.ErrClosed):
		return errContext
	case errors.Is(err, errNoMemory):
		return errMemory
	case errors.As(err, &dns):
		return errDNS
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) {
		return errSocket
	}
	return errInvalidArgument
}

// storeCode maps a store client error to its store code.
func storeCode(err error) int {
	var ae *argError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errBadHandle), errors.As(err, &ae), errors.Is(err, store.ErrInvalidConfig):
		return int(errcode.InvalidParams)
	case errors.Is(err, store.ErrClosed), errors.Is(err, local.ErrClosed):
		return int(errcode.UnavailableInCurrentStatus)
	}
	var e *errcode.Error
	if errors.As(err, &e) {
		return int(e.Code)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return int(errcode.RPCTimeout)
	}
	if errors.Is(err, local.ErrDisconnected) || errors.Is(err, local.ErrProtocol) {
		return int(errcode.RPCFail) // the real client's socket: gone or garbled
	}
	return int(errcode.InternalError)
}

var logger = newLogger(os.Getenv("CRESCENT_LOG_LEVEL"), os.Getenv("CRESCENT_LOG_FORMAT"))

// The library is its process's only Go code: its logger is the Go
// side's default too, so etcd's client, gRPC and every package that
// defaults to slog.Default() log in the same format.
func init() { logx.SetGlobal(logger) }

// newLogger is the library's logger on stderr: level debug|info|warn|error
// (any case; default or unknown: warn), format text or json (default or
// unknown: text).
func newLogger(level, format string) *slog.Logger {
	o := logx.Options{LogLevel: strings.ToLower(level), LogFormat: strings.ToLower(format)}
	if o.LogFormat != logx.FormatJSON {
		o.LogFormat = logx.FormatText
	}
	if o.Validate() != nil { // the level: empty or unknown
		o.LogLevel = "warn"
	}
	return o.New(os.Stderr)
}
