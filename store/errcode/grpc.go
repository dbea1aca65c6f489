package errcode

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/store/storepb"
)

// grpcCode picks the gRPC code that best matches a store code, so generic
// gRPC tooling reads failures sensibly; the exact store code travels in
// the status details.
func grpcCode(c Code) codes.Code {
	switch c {
	case OK:
		return codes.OK
	case ObjectNotFound, SegmentNotFound, ClientNotFound, ReplicaNotFound, FileNotFound, BucketNotFound, TaskNotFound, EtcdKeyNotExist:
		return codes.NotFound
	case ObjectAlreadyExists, SegmentAlreadyExists, ReplicaAlreadyExists, BucketAlreadyExists:
		return codes.AlreadyExists
	case InvalidKey, InvalidParams, InvalidVersion, InvalidReplica, InvalidWrite, InvalidRead:
		return codes.InvalidArgument
	case IllegalClient:
		return codes.PermissionDenied
	case NoAvailableHandle, KeysUltraLimit, KeysExceedBucketLimit, TaskPendingLimitExceeded:
		return codes.ResourceExhausted
	case ObjectHasLease, ReplicaIsNotReady, ObjectReplicaBusy, ObjectHasReplicationTask, UnavailableInCurrentStatus, UnavailableInCurrentMode:
		return codes.FailedPrecondition
	case LeaseExpired, RPCTimeout:
		return codes.DeadlineExceeded
	case NotSupported:
		return codes.Unimplemented
	case RPCFail:
		return codes.Unavailable
	}
	return codes.Internal
}

// ToStatus turns an error into a gRPC status error carrying its store code
// (InternalError for errors without one). Context errors keep their gRPC
// meaning.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && CodeOf(err) == InternalError {
		return err // already a status, e.g. from an interceptor
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	c := CodeOf(err)
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
			return &wrapped{e: Error{Code: RPCTimeout, Msg: err.Error()}, cause: err}
		}
		return &wrapped{e: Error{Code: RPCFail, Msg: err.Error()}, cause: err}
	}
	for _, d := range st.Details() {
		if ed, ok := d.(*storepb.ErrorDetail); ok {
			c := Code(ed.Code)
			// The message is the sender's err.Error(); drop the prefix
			// Error() adds again.
			msg := strings.TrimPrefix(strings.TrimPrefix(st.Message(), "store: "+c.String()), ": ")
			return &wrapped{e: Error{Code: c, Msg: msg}, cause: err}
		}
	}
	switch st.Code() {
	case codes.DeadlineExceeded:
		return &wrapped{e: Error{Code: RPCTimeout, Msg: st.Message()}, cause: err}
	case codes.Canceled:
		return &wrapped{e: Error{Code: RPCFail, Msg: st.Message()}, cause: context.Canceled}
	}
	return &wrapped{e: Error{Code: RPCFail, Msg: st.Code().String() + ": " + st.Message()}, cause: err}
}

// wrapped is a store error that also unwraps to the gRPC error it came
// from.
type wrapped struct {
	e     Error
	cause error
}

func (w *wrapped) Error() string { return w.e.Error() }
func (w *wrapped) Unwrap() error { return w.cause }

// Is matches store errors by code.
func (w *wrapped) Is(target error) bool { return w.e.Is(target) }

// As lets errors.As find the store error.
func (w *wrapped) As(target any) bool {
	if p, ok := target.(**Error); ok {
		*p = &w.e
		return true
	}
	return false
}
