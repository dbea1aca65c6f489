// Package errcode holds the store's error codes, with the numeric values of
// Mooncake Store (include/types.h), as Go errors, and maps them to gRPC
// statuses and back.
//
// Every code has a sentinel (ErrObjectNotFound, ...). Errors returned by
// the master and the client wrap an *Error carrying the code, so
//
//	errors.Is(err, errcode.ErrObjectNotFound)
//
// holds whatever detail message was attached, on either side of the wire.
// On the wire a failure is a gRPC status whose details hold a
// storepb.ErrorDetail{code, name}; batch answers carry the code per item.
package errcode
