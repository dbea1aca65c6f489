package rpcerr

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/storepb"
)

// grpcCode picks the gRPC code that best matches a store code, so generic
// gRPC tooling reads failures sensibly; the exact store code travels in
// the status details.
func grpcCode(c errcode.Code) codes.Code {
	switch c {
	case errcode.OK:
		return codes.OK
	case errcode.ObjectNotFound, errcode.SegmentNotFound, errcode.ClientNotFound, errcode.ReplicaNotFound, errcode.FileNotFound, errcode.BucketNotFound, errcode.TaskNotFound, errcode.EtcdKeyNotExist:
		return codes.NotFound
	case errcode.ObjectAlreadyExists, errcode.SegmentAlreadyExists, errcode.ReplicaAlreadyExists, errcode.BucketAlreadyExists:
		return codes.AlreadyExists
	case errcode.InvalidKey, errcode.InvalidParams, errcode.InvalidVersion, errcode.InvalidReplica, errcode.InvalidWrite, errcode.InvalidRead:
		return codes.InvalidArgument
	case errcode.IllegalClient:
		return codes.PermissionDenied
	case errcode.NoAvailableHandle, errcode.KeysUltraLimit, errcode.KeysExceedBucketLimit, errcode.TaskPendingLimitExceeded:
		return codes.ResourceExhausted
	case errcode.ObjectHasLease, errcode.ReplicaIsNotReady, errcode.ObjectReplicaBusy, errcode.ObjectHasReplicationTask, errcode.UnavailableInCurrentStatus, errcode.UnavailableInCurrentMode:
		return codes.FailedPrecondition
	case errcode.LeaseExpired, errcode.RPCTimeout:
		return codes.DeadlineExceeded
	case errcode.NotSupported:
		return codes.Unimplemented
	case errcode.RPCFail:
		return codes.Unavailable
	}
	return codes.Internal
}

// ToStatus turns an error into a gRPC status error carrying its store code
// (INTERNAL_ERROR for errors without one). Context errors keep their gRPC
// meaning.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && errcode.CodeOf(err) == errcode.InternalError {
		return err // already a status, e.g. from an interceptor
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	c := errcode.CodeOf(err)
	st := status.New(grpcCode(c), err.Error())
	if d, derr := st.WithDetails(&storepb.ErrorDetail{Code: int32(c), Name: c.String()}); derr == nil {
		st = d
	}
	return st.Err()
}

// FromStatus turns an error returned by a gRPC call back into a store
// error: the code in its details when present, otherwise RPC_TIMEOUT for
// deadlines and RPC_FAIL for transport failures. The result wraps the
// original error, so gRPC and context checks still work.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, context.DeadlineExceeded) {
			return &wrapped{e: errcode.Error{Code: errcode.RPCTimeout, Msg: err.Error()}, cause: err}
		}
		return &wrapped{e: errcode.Error{Code: errcode.RPCFail, Msg: err.Error()}, cause: err}
	}
	for _, d := range st.Details() {
		if ed, ok := d.(*storepb.ErrorDetail); ok {
			c := errcode.Code(ed.Code)
			// The message is the sender's err.Error(); drop the prefix
			// Error() adds again.
			msg := strings.TrimPrefix(strings.TrimPrefix(st.Message(), "store: "+c.String()), ": ")
			return &wrapped{e: errcode.Error{Code: c, Msg: msg}, cause: err}
		}
	}
	switch st.Code() {
	case codes.DeadlineExceeded:
		return &wrapped{e: errcode.Error{Code: errcode.RPCTimeout, Msg: st.Message()}, cause: err}
	case codes.Canceled:
		return &wrapped{e: errcode.Error{Code: errcode.RPCFail, Msg: st.Message()}, cause: context.Canceled}
	}
	return &wrapped{e: errcode.Error{Code: errcode.RPCFail, Msg: st.Code().String() + ": " + st.Message()}, cause: err}
}

// wrapped is a store error that also unwraps to the gRPC error it came
// from.
type wrapped struct {
	e     errcode.Error
	cause error
}

func (w *wrapped) Error() string { return w.e.Error() }
func (w *wrapped) Unwrap() error { return w.cause }

// Is matches store errors by code.
func (w *wrapped) Is(target error) bool { return w.e.Is(target) }

// As lets errors.As find the store error.
func (w *wrapped) As(target any) bool {
	if p, ok := target.(**errcode.Error); ok {
		*p = &w.e
		return true
	}
	return false
}

// CallsBound is in the message of the status (RESOURCE_EXHAUSTED) the
// master answers a gRPC call with when its bound on calls open is spent:
// the call was refused as its headers arrived, before anything of it
// was read.
const CallsBound = "gRPC calls open, its bound"

// Unprocessed reports whether err says the master refused the call
// before processing it, so that sending it again is safe whatever the
// method: an HTTP/2 RST_STREAM with REFUSED_STREAM (RFC 9113 §8.7; the
// master's request-byte bound), as grpc-go reports it, or the bound on
// gRPC calls open (CallsBound).
func Unprocessed(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.Unavailable:
		return strings.Contains(s.Message(), "REFUSED_STREAM")
	case codes.ResourceExhausted:
		return strings.Contains(s.Message(), CallsBound)
	}
	return false
}
