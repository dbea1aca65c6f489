package errcode

import (
	"errors"
	"fmt"
	"strconv"
)

// Code is a store error code. OK is 0; errors are negative.
type Code int32

// The reference's codes.
const (
	OK                         Code = 0
	InternalError              Code = -1
	BufferOverflow             Code = -10
	SegmentNotFound            Code = -101
	SegmentAlreadyExists       Code = -102
	ClientNotFound             Code = -103
	NoAvailableHandle          Code = -200
	InvalidVersion             Code = -300
	InvalidKey                 Code = -400
	WriteFail                  Code = -500
	InvalidParams              Code = -600
	IllegalClient              Code = -601
	InvalidWrite               Code = -700
	InvalidRead                Code = -701
	InvalidReplica             Code = -702
	ReplicaIsNotReady          Code = -703
	ObjectNotFound             Code = -704
	ObjectAlreadyExists        Code = -705
	ObjectHasLease             Code = -706
	LeaseExpired               Code = -707
	ObjectHasReplicationTask   Code = -708
	ObjectNoReplicationTask    Code = -709
	ReplicaNotFound            Code = -710
	ReplicaAlreadyExists       Code = -711
	ReplicaIsGone              Code = -712
	ReplicaNotInLocalMemory    Code = -713
	ObjectReplicaBusy          Code = -714
	TransferFail               Code = -800
	ChecksumMismatch           Code = -801
	RPCFail                    Code = -900
	RPCTimeout                 Code = -901
	EtcdOperationError         Code = -1000
	EtcdKeyNotExist            Code = -1001
	EtcdTransactionFail        Code = -1002
	EtcdCtxCancelled           Code = -1003
	OplogEntryNotFound         Code = -1004
	IncompleteOplogCatchUp     Code = -1007
	UnavailableInCurrentStatus Code = -1010
	UnavailableInCurrentMode   Code = -1011
	NotSupported               Code = -1012
	FileNotFound               Code = -1100
	FileOpenFail               Code = -1101
	FileReadFail               Code = -1102
	FileWriteFail              Code = -1103
	FileInvalidBuffer          Code = -1104
	FileLockFail               Code = -1105
	FileInvalidHandle          Code = -1106
	BucketNotFound             Code = -1200
	BucketAlreadyExists        Code = -1201
	KeysExceedBucketLimit      Code = -1202
	KeysUltraLimit             Code = -1203
	UnableOffload              Code = -1300
	UnableOffloading           Code = -1301
	TaskNotFound               Code = -1400
	TaskPendingLimitExceeded   Code = -1401
	SerializeFail              Code = -1501
	DeserializeFail            Code = -1502
)

var names = map[Code]string{
	OK: "OK", InternalError: "INTERNAL_ERROR", BufferOverflow: "BUFFER_OVERFLOW",
	SegmentNotFound:      "SEGMENT_NOT_FOUND",
	SegmentAlreadyExists: "SEGMENT_ALREADY_EXISTS", ClientNotFound: "CLIENT_NOT_FOUND",
	NoAvailableHandle: "NO_AVAILABLE_HANDLE", InvalidVersion: "INVALID_VERSION",
	InvalidKey: "INVALID_KEY", WriteFail: "WRITE_FAIL", InvalidParams: "INVALID_PARAMS",
	IllegalClient: "ILLEGAL_CLIENT", InvalidWrite: "INVALID_WRITE", InvalidRead: "INVALID_READ",
	InvalidReplica: "INVALID_REPLICA", ReplicaIsNotReady: "REPLICA_IS_NOT_READY",
	ObjectNotFound: "OBJECT_NOT_FOUND", ObjectAlreadyExists: "OBJECT_ALREADY_EXISTS",
	ObjectHasLease: "OBJECT_HAS_LEASE", LeaseExpired: "LEASE_EXPIRED",
	ObjectHasReplicationTask: "OBJECT_HAS_REPLICATION_TASK", ObjectNoReplicationTask: "OBJECT_NO_REPLICATION_TASK",
	ReplicaNotFound: "REPLICA_NOT_FOUND", ReplicaAlreadyExists: "REPLICA_ALREADY_EXISTS",
	ReplicaIsGone: "REPLICA_IS_GONE", ReplicaNotInLocalMemory: "REPLICA_NOT_IN_LOCAL_MEMORY",
	ObjectReplicaBusy: "OBJECT_REPLICA_BUSY", TransferFail: "TRANSFER_FAIL",
	ChecksumMismatch: "CHECKSUM_MISMATCH", RPCFail: "RPC_FAIL", RPCTimeout: "RPC_TIMEOUT",
	EtcdOperationError: "ETCD_OPERATION_ERROR", EtcdKeyNotExist: "ETCD_KEY_NOT_EXIST",
	EtcdTransactionFail: "ETCD_TRANSACTION_FAIL", EtcdCtxCancelled: "ETCD_CTX_CANCELLED",
	OplogEntryNotFound: "OPLOG_ENTRY_NOT_FOUND", IncompleteOplogCatchUp: "INCOMPLETE_OPLOG_CATCH_UP",
	UnavailableInCurrentStatus: "UNAVAILABLE_IN_CURRENT_STATUS", UnavailableInCurrentMode: "UNAVAILABLE_IN_CURRENT_MODE",
	NotSupported: "NOT_SUPPORTED", FileNotFound: "FILE_NOT_FOUND", FileOpenFail: "FILE_OPEN_FAIL",
	FileReadFail: "FILE_READ_FAIL", FileWriteFail: "FILE_WRITE_FAIL", FileInvalidBuffer: "FILE_INVALID_BUFFER",
	FileLockFail: "FILE_LOCK_FAIL", FileInvalidHandle: "FILE_INVALID_HANDLE",
	BucketNotFound: "BUCKET_NOT_FOUND", BucketAlreadyExists: "BUCKET_ALREADY_EXISTS",
	KeysExceedBucketLimit: "KEYS_EXCEED_BUCKET_LIMIT", KeysUltraLimit: "KEYS_ULTRA_LIMIT",
	UnableOffload: "UNABLE_OFFLOAD", UnableOffloading: "UNABLE_OFFLOADING",
	TaskNotFound: "TASK_NOT_FOUND", TaskPendingLimitExceeded: "TASK_PENDING_LIMIT_EXCEEDED",
	SerializeFail: "SERIALIZE_FAIL", DeserializeFail: "DESERIALIZE_FAIL",
}

// String is the reference's name of the code ("OBJECT_NOT_FOUND").
func (c Code) String() string {
	if n, ok := names[c]; ok {
		return n
	}
	return "ERROR_CODE(" + strconv.Itoa(int(c)) + ")"
}

// Known reports whether c is one of the reference's codes.
func (c Code) Known() bool {
	_, ok := names[c]
	return ok
}

// Error is a store error: a code and an optional detail message.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return "store: " + e.Code.String()
	}
	return "store: " + e.Code.String() + ": " + e.Msg
}

// Is matches any *Error with the same code, so sentinels match errors
// carrying detail.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code
}

// New returns an error with code c and a formatted detail message.
func New(c Code, format string, args ...any) error {
	return &Error{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf returns the code of err: OK for nil, InternalError for errors
// that carry none.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return InternalError
}

// FromCode turns a code received in a batch answer into an error (nil for
// OK).
func FromCode(c Code, msg string) error {
	if c == OK {
		return nil
	}
	return &Error{Code: c, Msg: msg}
}

// Sentinels, one per code, for errors.Is.
var (
	ErrInternal                   = &Error{Code: InternalError}
	ErrBufferOverflow             = &Error{Code: BufferOverflow}
	ErrSegmentNotFound            = &Error{Code: SegmentNotFound}
	ErrSegmentAlreadyExists       = &Error{Code: SegmentAlreadyExists}
	ErrClientNotFound             = &Error{Code: ClientNotFound}
	ErrNoAvailableHandle          = &Error{Code: NoAvailableHandle}
	ErrInvalidVersion             = &Error{Code: InvalidVersion}
	ErrInvalidKey                 = &Error{Code: InvalidKey}
	ErrWriteFail                  = &Error{Code: WriteFail}
	ErrInvalidParams              = &Error{Code: InvalidParams}
	ErrIllegalClient              = &Error{Code: IllegalClient}
	ErrInvalidWrite               = &Error{Code: InvalidWrite}
	ErrInvalidRead                = &Error{Code: InvalidRead}
	ErrInvalidReplica             = &Error{Code: InvalidReplica}
	ErrReplicaIsNotReady          = &Error{Code: ReplicaIsNotReady}
	ErrObjectNotFound             = &Error{Code: ObjectNotFound}
	ErrObjectAlreadyExists        = &Error{Code: ObjectAlreadyExists}
	ErrObjectHasLease             = &Error{Code: ObjectHasLease}
	ErrLeaseExpired               = &Error{Code: LeaseExpired}
	ErrObjectHasReplicationTask   = &Error{Code: ObjectHasReplicationTask}
	ErrObjectNoReplicationTask    = &Error{Code: ObjectNoReplicationTask}
	ErrReplicaNotFound            = &Error{Code: ReplicaNotFound}
	ErrReplicaAlreadyExists       = &Error{Code: ReplicaAlreadyExists}
	ErrReplicaIsGone              = &Error{Code: ReplicaIsGone}
	ErrReplicaNotInLocalMemory    = &Error{Code: ReplicaNotInLocalMemory}
	ErrObjectReplicaBusy          = &Error{Code: ObjectReplicaBusy}
	ErrTransferFail               = &Error{Code: TransferFail}
	ErrChecksumMismatch           = &Error{Code: ChecksumMismatch}
	ErrRPCFail                    = &Error{Code: RPCFail}
	ErrRPCTimeout                 = &Error{Code: RPCTimeout}
	ErrEtcdOperationError         = &Error{Code: EtcdOperationError}
	ErrEtcdKeyNotExist            = &Error{Code: EtcdKeyNotExist}
	ErrEtcdTransactionFail        = &Error{Code: EtcdTransactionFail}
	ErrEtcdCtxCancelled           = &Error{Code: EtcdCtxCancelled}
	ErrOplogEntryNotFound         = &Error{Code: OplogEntryNotFound}
	ErrIncompleteOplogCatchUp     = &Error{Code: IncompleteOplogCatchUp}
	ErrUnavailableInCurrentStatus = &Error{Code: UnavailableInCurrentStatus}
	ErrUnavailableInCurrentMode   = &Error{Code: UnavailableInCurrentMode}
	ErrNotSupported               = &Error{Code: NotSupported}
	ErrFileNotFound               = &Error{Code: FileNotFound}
	ErrFileOpenFail               = &Error{Code: FileOpenFail}
	ErrFileReadFail               = &Error{Code: FileReadFail}
	ErrFileWriteFail              = &Error{Code: FileWriteFail}
	ErrFileInvalidBuffer          = &Error{Code: FileInvalidBuffer}
	ErrFileLockFail               = &Error{Code: FileLockFail}
	ErrFileInvalidHandle          = &Error{Code: FileInvalidHandle}
	ErrBucketNotFound             = &Error{Code: BucketNotFound}
	ErrBucketAlreadyExists        = &Error{Code: BucketAlreadyExists}
	ErrKeysExceedBucketLimit      = &Error{Code: KeysExceedBucketLimit}
	ErrKeysUltraLimit             = &Error{Code: KeysUltraLimit}
	ErrUnableOffload              = &Error{Code: UnableOffload}
	ErrUnableOffloading           = &Error{Code: UnableOffloading}
	ErrTaskNotFound               = &Error{Code: TaskNotFound}
	ErrTaskPendingLimitExceeded   = &Error{Code: TaskPendingLimitExceeded}
	ErrSerializeFail              = &Error{Code: SerializeFail}
	ErrDeserializeFail            = &Error{Code: DeserializeFail}
)
