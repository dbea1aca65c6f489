// Package storepb is the gRPC contract of the store master: the messages
// and service generated from master.proto (committed; `make proto`
// regenerates them with pinned generator versions, and `make test` fails
// when they are stale). Errors travel as gRPC statuses with an ErrorDetail;
// package store/errcode converts them.
//
// Batch replies can carry their memory replicas packed (PackedReplicas,
// built by Packer, read by Unpack): one message of columns for the whole
// batch instead of four messages per replica, which were most of the
// allocations of a batch put or get; likewise their per-item results
// (PackedResults, built by PackResults). A request asks with its packed
// flag; a master answers packed only for two entries or more, all in memory,
// and one that predates the flag ignores it, so clients read both forms.
package storepb
