// Package rdma is the RDMA transport: one-sided RDMA READ and WRITE over
// reliable-connected (RC) queue pairs, as the reference engine's RDMA
// transport does, written against the small device interface of package
// rdmadev. Real NICs come from internal/verbs (libibverbs, loaded at run
// time); Config.Devices substitutes other devices, such as the software
// NICs of package soft that the tests and crescent-bench use.
//
// # Contract
//
//   - Start opens every usable NIC (its first ACTIVE port), one protection
//     domain and one completion queue per NIC, and a poller per CQ. On a
//     host without RDMA devices (or without libibverbs, or in a build
//     without cgo and the verbs tag) it fails with an error wrapping
//     transport.ErrNotSupported: the engine skips the transport with one
//     Info log line and uses the next one (tcp).
//   - AfterRegister registers each buffer on every NIC (local write,
//     remote read and write). BeforeUnregister refuses new requests from
//     the buffer, waits for those running (until its context ends), then
//     deregisters: no peer can reach the buffer afterwards.
//   - Submit never blocks on the network. A request is cut into slices of
//     SliceSize (64 KiB); each slice takes a (local NIC, peer NIC) path:
//     the NICs preferred for the local buffer's location (NUMA node, from
//     the priority matrix) and for the remote buffer's, spread
//     round-robin. Slices queue on the endpoint of their path and are
//     posted as one PostSend per QP per call, spread over the endpoint's
//     QPsPerEndpoint QPs, within each QP's MaxWR and each NIC's CQDepth.
//     Completions are polled PollBatch at a time; when the CQ is empty
//     the poller arms it and waits on the completion channel in the Go
//     netpoller, never inside C.
//   - Endpoints are cached per (local NIC, peer NIC path), at most
//     MaxEndpoints (least recently used, idle first, evicted beyond; an
//     evicted endpoint finishes its outstanding work first). An endpoint
//     a peer created by its handshake is used for our transfers to that
//     peer NIC too, as in the reference; a peer's new handshake for the
//     same NIC pair replaces it.
//   - Errors: a slice whose completion reports a path error (retry
//     exceeded, RNR, fatal...) takes its endpoint out of service (QPs to
//     ERR; queued and flushed slices go elsewhere) and is sent again on
//     another path, up to MaxRetries times. PauseErrors such errors on a
//     NIC pair within PauseWindow pause the pair for PauseFor; a NIC whose
//     port is not ACTIVE leaves path choice until it is again. With every
//     pair to a peer paused or down, Accepts declines the peer (the
//     engine uses another transport) and slices end with ErrNoPath. A
//     remote access or protection error fails the request at once, as
//     transport.ErrRejected (*CompletionError carries the status).
//   - Deadlines: a queued slice past its task's deadline (or of an
//     aborted task) is dropped; a posted one gets its endpoint's QPs moved
//     to ERR, and if the flush does not come within FlushTimeout the QPs
//     are reset. Only then does the task complete with
//     transport.ErrTimeout, so the engine never gets a buffer back while
//     a NIC may still write into it.
//   - Close completes every pending task with transport.ErrClosed after
//     resetting its QPs, and releases every QP, MR, CQ and PD (and the
//     devices and library it opened itself; given Devices stay open).
//
// # Handshake (Connection frame, "protocol": "rdma")
//
// The active side sends, over the engine's handshake (engine/metadata),
// the reference's HandShakeDesc as JSON and the passive side replies with
// the same shape:
//
//	{"protocol":"rdma",
//	 "local_nic_path":"<segment>@<device>",   sender's NIC
//	 "peer_nic_path":"<segment>@<device>",    receiver's NIC
//	 "qp_num":[<u32>,...],                    sender's QP numbers, one per QP
//	 "local_lid":<u16>, "local_gid":"xx:xx:...:xx" (16 hex bytes),
//	 "reply_msg":"",                          non-empty = refused, with the reason
//	 "crescent_mtu":<bytes>}                  Crescent only: sender's active MTU
//
// QP i of one side connects to QP i of the other (RESET→INIT→RTR→RTS with
// the reference's attributes: path MTU min(both active MTUs, MaxMTU),
// GRH with the peer's GID, hop limit 16, PSN 0, max_dest_rd_atomic 16,
// min_rnr_timer 12, timeout 14, retry 7, rnr_retry 7). A refusal comes
// back as {"status":"error","reply_msg":"..."} from Crescent peers (a
// bare non-empty reply_msg from reference peers); both fail the
// handshake with ErrHandshake and the peer's reason. A reference peer's
// request without local_gid is refused (Crescent does not look GIDs up
// in the peer's descriptor on the passive side).
//
// # Descriptor
//
// Describe appends the NICs to "devices" as {"name","lid","gid"} (GID in
// the text above), each buffer's rkey and lkey on those NICs to its
// "rkey"/"lkey" arrays at the same indexes (padding with 0 where a
// transport listed before has no key), merges its NICs into
// "priority_matrix" ({"cpu:N": [[NICs on node N],[the others]], "*":
// [[all],[]]}), and sets "crescent": {"rdma": {"first_device": F,
// "devices": N}} locating them. A reference descriptor with protocol
// "rdma" and no crescent object is read as "every device is an RDMA NIC".
package rdma
