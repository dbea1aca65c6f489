// Package rdmadev is the small device interface the RDMA transport is
// written against: the part of libibverbs it needs, in Go types.
//
// # Contract
//
//   - A Device is one NIC with its ports (state, LID, GID, active MTU) and
//     NUMA node. From it: protection domains (PD), completion queues (CQ)
//     each with its own completion channel, and from a PD: memory regions
//     (MR, returning lkey/rkey) and RC queue pairs (QP).
//   - A QP goes RESET → INIT (port, remote access) → RTR (peer QP number,
//     LID, GID, path MTU) → RTS (timeout, retry counts), as ibv_modify_qp.
//     SetError flushes every outstanding work request (each completes
//     with WCWRFlushErr); Reset drops them without completions and
//     guarantees the device no longer touches their memory.
//   - Hot paths take batches: QP.PostSend posts a slice of one-SGE
//     RDMA READ/WRITE work requests in one call (all signaled) and
//     CQ.Poll fills a slice of completions in one call. On real hardware
//     each of those is one cgo crossing. CQ.Arm + CQ.Wait wait for the
//     next completion without blocking in C.
//   - Completions of one QP come in posting order. Statuses, opcodes,
//     port states, QP states, access flags and MTU enums have
//     libibverbs' numeric values.
//   - Object lifetimes are explicit: Close every QP, MR, CQ and PD
//     before the Device.
//
// Implementations: internal/verbs (libibverbs through cgo, loaded at run
// time) and engine/transport/rdma/soft (a software device implementing
// RC semantics over local memory, with fault injection).
//
// # Formats
//
// GID text is the reference's: 16 two-digit lowercase hex bytes joined by
// ':' ("fe:80:00:00:00:00:00:00:02:1b:21:ff:fe:38:a1:b2"). MTU values are
// bytes (256..4096); Enum gives ibv_mtu (1..5).
package rdmadev
