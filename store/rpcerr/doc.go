// Package rpcerr maps store errors (store/errcode) to gRPC statuses and
// back; it is the only package that does.
//
// On the wire a failure is a gRPC status whose code is the closest gRPC
// code (NotFound, AlreadyExists, InvalidArgument, ...; Internal for errors
// without a store code) and whose details hold one
// storepb.ErrorDetail{code, name} with the exact store code; batch answers
// carry the code per item instead. ToStatus builds that status on the
// server; FromStatus turns a call's error back into a store error on the
// client: the code in the details when present, otherwise RPC_TIMEOUT for
// deadlines and RPC_FAIL for other transport failures. The result matches
// the errcode sentinels with errors.Is and still unwraps to the gRPC
// error. Context errors keep their gRPC meaning (DeadlineExceeded,
// Canceled).
//
// It is split from errcode so that errcode links neither gRPC nor
// storepb.
package rpcerr
