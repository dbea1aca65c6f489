// Package verbs is the only package that imports "C" for libibverbs. It
// implements the rdmadev device interface over real RDMA NICs.
//
// # Building and loading
//
// The cgo implementation is compiled with the build tag "verbs" (the
// Makefile sets it where libibverbs-dev is installed) and cgo enabled;
// otherwise a stub is built whose Load reports ErrUnavailable. The
// library is not linked: Load dlopen's libibverbs.so.1 (RTLD_NOW |
// RTLD_LOCAL) and resolves the exported calls it needs into function
// pointers, so a binary starts on a host without rdma-core and reports
// RDMA as unavailable (errors match rdmadev.ErrNotSupported). The data
// path uses libibverbs' static inline wrappers (ibv_post_send,
// ibv_poll_cq, ibv_req_notify_cq), which call the provider's ops table of
// the objects the library returned. The binary links only -ldl (libc).
//
// # Discovery
//
// Library.Devices opens every device ibv_get_device_list returns with the
// IB transport type (InfiniBand and RoCE; iWARP and EFA devices are
// skipped), optionally filtered by name, and reports for each: its ports
// (ibv_query_port: state, LID, link layer, active and max MTU), the GID
// chosen per port (ChooseGID over ibv_query_gid and sysfs
// ports/<p>/gid_attrs/types: RoCE v2 with an IPv4-mapped address first on
// Ethernet; Options.GIDIndex forces one), and its NUMA node
// (/sys/class/infiniband/<dev>/device/numa_node, -1 if unknown). With no
// device — as on a machine without an RDMA NIC or kernel support — it
// returns ErrNoDevices.
//
// # Crossings
//
// Work requests are written by Go into a C array owned by each QP and
// posted as one chain with one cgo call (PostSend); completions are
// polled into a C array and copied into a flat layout with one call
// (Poll); neither passes Go pointers to C. A CQ's completion channel fd
// is non-blocking and waited for in the Go netpoller (a duplicate
// descriptor wrapped in an *os.File); Wait then takes the event with
// ibv_get_cq_event and acks it in one call. Crossings counts every cgo
// call by kind, so benchmarks can report crossings per batch.
//
// Every object (device, PD, MR, CQ, QP) has an explicit Close; a device
// must outlive its objects and the Library its devices. QP.Reset moves a
// QP to RESET with ibv_modify_qp; the HCA drops the QP's outstanding work
// when the command returns.
//
// # Verification
//
// No RDMA NIC was available where this package was written: the tests
// run discovery (no devices → ErrNoDevices), library loading failures,
// the pure helpers, and the data-path shims (post chaining, poll
// translation, arm, netpoller wait) against a fake provider (fake.h)
// that installs its own ops table. QP creation, transitions and memory
// registration against real hardware have not run.
package verbs
