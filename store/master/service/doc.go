// Package service is the master's RPC adapter: the gRPC contract of
// store/storepb (and the same handlers over internal/crpc) in front of a
// store/master.Master. It holds no metadata of its own.
//
// Service implements storepb.MasterServer: it converts messages, calls the
// core (store/master), and answers failures with rpcerr.ToStatus (the store code in the
// status details; clients recover it with rpcerr.FromStatus). Batch RPCs
// answer every item in request order with its code (0 = OK); a malformed
// batch (keys and sizes of different lengths, missing client_id) fails as
// a whole with INVALID_PARAMS, as does a batch of more than
// storepb.MaxBatchItems (10,000) keys or CommitPut items, refused before
// anything is sized by its count. Write, segment and Ping RPCs need client_id.
// ReservePut and CommitPut answer per spec and per item, give back the
// release ids first (unknown ones are ignored), carry the reservation TTL
// (PutDiscardTimeout) and take at most 64 specs of at most 64 each.
// ReportFailedSegments (Crescent's) takes at most 64 segment ids.
// WaitInvalidations (Crescent's) is the hot cache's long poll of
// master.WaitInvalidations (at most 1024 items and 1 MiB of keys an
// answer; the hold is capped at a third of InvalidationTTL).
// WithDurability (an operation log's wait) makes every RPC answer only
// once all the master logged before the answer is durable, and
// INTERNAL_ERROR when the log failed (/health then answers 503 with the
// cause); the wait runs in UnaryInterceptor. WithReadDurability narrows
// it for reads of keys (GetReplicaList, ExistKey, BatchGetReplicaList,
// BatchExistKey): they wait only for the last logged changes of their
// keys. The admin pages
// that show keys or segments (store/master/admin.Handler) wait the same
// way (Service.WaitDurable). Each wait is counted per RPC with its
// time (RPCCount.DurableWaits, DurableWaitNanos): the log's share of an
// RPC's latency.
// Service.Counts and WithObserver feed metrics (store/master/admin), counted in one place:
// Service.UnaryInterceptor, which Serve installs on both of its servers
// (a server given the service through Register alone needs it too).
// Serve runs a grpc.Server and a crpc server (internal/crpc; WithCRPC
// bounds it) on one port until its context ends; with WithCRPC's TLS the
// port is TLS for both (handshake first, then the split by preface;
// mTLS through the tls.Config's ClientAuth, gRPC handlers see the
// peer's certificate). The gRPC server has crpc's bounds on calls open:
// ServerConfig.MaxCallsPerConn streams per connection (a stream past it
// is refused, REFUSED_STREAM) and MaxCalls calls across connections
// (past it a call is answered RESOURCE_EXHAUSTED from its headers, before
// its request is read), and a call's headers are at most 64 KiB. The
// request bytes gRPC holds across connections are bounded like crpc's
// (internal/h2bound, with ServerConfig.MaxBufferedBytes and
// FrameTimeout, a budget of its own): DATA of a call counts from its
// arrival to the call's end, a connection that finds the budget spent
// stops being read, and one holding a request stalled half-way past the
// frame timeout is closed while others wait.
//
// # Identity and authorisation
//
// A request that acts as a client (it has client_id: puts, reservations,
// segments, Ping, ReportFailedSegments) must carry that client's session
// (the session field, 32 bytes): the client id is the first 16 bytes of
// SHA-256("crescent-client-id-v1" | session) (internal/auth.ClientID).
// UnaryInterceptor checks it before the handler runs and answers
// ILLEGAL_CLIENT otherwise, so a client id read off an admin page
// (/get_all_segments) or guessed lets nobody end, revoke or commit that
// client's puts, unmount or re-mount its segments or ping for it. The
// master keeps no session: nothing to log, snapshot, replicate to a
// standby or lose in a restart, and nothing any page could show. The core
// still checks ownership (another client's put or segment:
// ILLEGAL_CLIENT).
//
// WithAdminToken makes RemoveAll, RemoveByRegex and forced Remove and
// BatchRemove need the admin token in their admin_token field (compared
// in constant time; ILLEGAL_CLIENT otherwise); with a nil token they are
// refused. Without the option they are open (an in-process master).
// WithTransportSecurity sets the port's TLS, the cluster token every
// connection proves before its first byte is routed (crpc.SplitAuth;
// gRPC clients use crpc.TokenCredentials) and the peer filter of the
// protected default (auth.Mode.Allow).
//
// RPCNames lists the RPC names RPCCount and observers use, in a fixed
// order; they name the per-RPC metrics (master_<rpc>_requests_total).
package service
