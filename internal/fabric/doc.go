// Package fabric is Crescent's only binding to libfabric (the only
// package importing "C" for it). It opens RDM endpoints with RMA, one
// per domain (NIC), registers memory, keeps address vectors, posts reads
// and writes in batches and drains completion queues in batches.
//
// # Build and loading
//
// The cgo code builds with the fabric tag (make sets it where
// libfabric-dev is installed); without the tag or without cgo, a stub
// returns ErrNotSupported from every call and Built is false. The C shim
// (shim.c, shim.h, in this folder so the go command tracks their changes)
// links only -ldl: Load opens libfabric with dlopen(RTLD_NOW|RTLD_LOCAL)
// and resolves fi_getinfo, fi_freeinfo, fi_dupinfo, fi_fabric,
// fi_strerror and fi_version; every other call is libfabric's inline
// dispatch through the objects' ops tables. A binary therefore starts on a
// host without libfabric, and Load reports ErrNotSupported (path:
// argument, else $MC_LIBFABRIC_PATH, else libfabric.so.1, then
// /opt/amazon/efa/lib/libfabric.so.1). The API version asked of
// fi_getinfo is the library's own, capped at the headers'.
//
// # Contract
//
//   - Discover lists the domains of a provider offering FI_EP_RDM with
//     FI_RMA|FI_READ|FI_WRITE|FI_REMOTE_READ|FI_REMOTE_WRITE, asking for
//     FI_DELIVERY_COMPLETE (a write completes once placed in target
//     memory) and falling back to the provider's default when it cannot.
//     Hints allow mr_mode FI_MR_LOCAL|VIRT_ADDR|ALLOCATED|PROV_KEY|ENDPOINT
//     and mode FI_CONTEXT|FI_CONTEXT2; the returned bits are honoured: the
//     MR descriptor is always passed, keys come from the provider with
//     PROV_KEY (else the caller's), MRs are bound to the endpoint with
//     ENDPOINT, and remote addresses are virtual addresses with VIRT_ADDR,
//     else offsets into the MR (Info.MRMode tells the caller which).
//   - Open creates fabric, domain (FI_THREAD_DOMAIN), an FI_AV_TABLE
//     address vector, a completion queue (FI_CQ_FORMAT_CONTEXT, with a
//     wait fd when asked and offered) and one endpoint. All methods of an
//     Endpoint are serialised by its mutex.
//   - Progress is the hot path and one crossing: it posts up to MaxBatch
//     operations (fi_writemsg/fi_readmsg, FI_MORE on all but the last),
//     and on -FI_EAGAIN reads completions (progress) and retries a few
//     times before giving the rest back (Result.Attempted); then it reads
//     up to MaxCompletions completions, with fi_cq_readerr and
//     fi_cq_strerror for failed ones (*CQError keeps the code and the
//     provider's text). It never blocks: with wantWait and nothing to do
//     it asks fi_trywait whether the caller may sleep on WaitFD.
//   - Each operation owns a slot (a struct fi_context2 in C memory) until
//     its completion; no Go pointer is passed to C inside a structure.
//   - Reset closes the endpoint (the provider drops the operations still
//     posted and no longer touches their buffers) and opens a new one on
//     the same domain, address vector and completion queue; impossible
//     with FI_MR_ENDPOINT (ErrNoReset).
//   - Close releases everything with explicit closes: endpoint, MRs,
//     completion queue, address vector, domain, fabric.
//
// ReadStats counts every crossing into C (Calls), Progress calls and
// those that posted (PostCalls), for tests and benchmarks.
package fabric
