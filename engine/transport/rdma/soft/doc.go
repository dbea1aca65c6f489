// Package soft is a software RDMA device: it implements the rdmadev
// interface with reliable-connected READ/WRITE semantics over local
// memory, so the RDMA transport's logic runs (in tests and in
// crescent-bench) on a machine without an RDMA NIC.
//
// # Model
//
//   - A Fabric is a network; each Device is a NIC on it, with one port
//     (ACTIVE, a GID derived from 10.x.y.z, LID 0 for the default RoCE
//     link layer or a LID on InfiniBand), a NUMA node and an active MTU.
//   - Memory registered on a PD gets an lkey and an rkey. A work request
//     is checked as an HCA checks it: the remote QP must exist, be in
//     RTR/RTS and be connected back to the requester (else
//     WCRetryExcErr); the responder QP must allow the operation (else
//     WCRemInvReqErr) and the rkey must name a region of the responder's
//     PD with the remote access flag, covering the whole range (else
//     WCRemAccessErr, and the responder QP goes to ERR too); the lkey
//     must name a local region of the requester's PD covering the range,
//     with local write for a READ (else WCLocProtErr).
//   - One worker goroutine per device executes work requests; per QP
//     they execute and complete in posting order. After an error
//     completion the QP is in ERR and everything queued behind is
//     flushed (WCWRFlushErr). SetError flushes; Reset and Close drop the
//     queue and return only once no copy is in progress; MR.Close
//     returns only once no copy touches the region.
//   - A full CQ overruns: Poll fails with ErrCQOverrun from then on.
//   - QP transitions follow RESET → INIT → RTR → RTS; RTR needs a valid
//     path MTU not above the port's active MTU and a GRH on RoCE.
//
// # Fault injection
//
// Device.Inject adds FaultError (error completion), FaultDrop (lost
// completion), FaultDelay (late execution) or FaultHang (no execution, no
// flush) for some or all QPs; SetPortState takes the link down or up;
// ErrorQP is an asynchronous QP error; BreakCQs makes the device's CQs
// fail.
//
// # Counting
//
// Stats counts the calls made through the interface — PostSend, Poll,
// Arm, Wait (the calls that are cgo crossings with libibverbs) and the
// control calls — plus what the device did; Live counts open objects so
// tests can check that Close released everything.
package soft
