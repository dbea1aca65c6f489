// Package storepb is the gRPC contract of the store master: the messages
// and service generated from master.proto (committed; `make proto`
// regenerates them with pinned generator versions, and `make test` fails
// when they are stale). Errors travel as gRPC statuses with an ErrorDetail;
// package store/errcode converts them.
package storepb
