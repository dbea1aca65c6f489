// Package errcode holds the store's error codes, with the numeric values of
// Mooncake Store (include/types.h), as Go errors.
//
// Every code has a sentinel (ErrObjectNotFound, ...). Errors returned by
// the master and the client wrap an *Error carrying the code, so
//
//	errors.Is(err, errcode.ErrObjectNotFound)
//
// holds whatever detail message was attached, on either side of the wire.
//
// The package imports only the standard library, so the RPC-free packages
// (store/alloc, the master core) can use it without linking gRPC or
// protobuf. The mapping to and from gRPC statuses lives in store/rpcerr.
package errcode
