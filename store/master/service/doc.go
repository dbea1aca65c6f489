// Package service is the master's RPC adapter: the gRPC contract of
// store/storepb (and the same handlers over internal/crpc) in front of a
// store/master.Master. It holds no metadata of its own.
//
// Service implements storepb.MasterServer: it converts messages, calls the
// core (store/master), and answers failures with rpcerr.ToStatus (the store code in the
// status details; clients recover it with rpcerr.FromStatus). Batch RPCs
// answer every item in request order with its code (0 = OK); a malformed
// batch (keys and sizes of different lengths, missing client_id) fails as
// a whole with INVALID_PARAMS. Write, segment and Ping RPCs need client_id.
// ReservePut and CommitPut answer per spec and per item, give back the
// release ids first (unknown ones are ignored), carry the reservation TTL
// (PutDiscardTimeout) and take at most 64 specs of at most 64 each.
// ReportFailedSegments (Crescent's) takes at most 64 segment ids.
// WaitInvalidations (Crescent's) is the hot cache's long poll of
// master.WaitInvalidations (at most 1024 items and 1 MiB of keys an
// answer; the hold is capped at a third of InvalidationTTL).
// WithDurability (an operation log's wait) makes every RPC, reads
// included, answer only once all the master logged before the answer is
// durable, and INTERNAL_ERROR when the log failed (/health then answers
// 503 with the cause); the wait runs in UnaryInterceptor. The admin pages
// that show keys or segments (store/master/admin.Handler) wait the same
// way (Service.WaitDurable).
// Service.Counts and WithObserver feed metrics (store/master/admin), counted in one place:
// Service.UnaryInterceptor, which Serve installs on both of its servers
// (a server given the service through Register alone needs it too).
// Serve runs a grpc.Server and a crpc server (internal/crpc; WithCRPC
// bounds it) on one port until its context ends; with WithCRPC's TLS the
// port is TLS for both (handshake first, then the split by preface;
// mTLS through the tls.Config's ClientAuth, gRPC handlers see the
// peer's certificate).
//
// RPCNames lists the RPC names RPCCount and observers use, in a fixed
// order; they name the per-RPC metrics (master_<rpc>_requests_total).
package service
