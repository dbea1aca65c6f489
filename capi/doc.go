// Command capi is libcrescent.so: the C ABI of include/crescent.h,
// built with `go build -buildmode=c-shared` (make lib). It is a package
// main only because c-shared needs one; nothing imports it.
//
// # Contract
//
//   - Objects (engines, store clients, zero-copy buffers) cross into C as
//     64-bit handles from one table (handles.go): a counter that never
//     repeats, so a destroyed, stale or forged handle finds nothing and
//     the call fails with a code instead of a crash. No Go pointer is
//     handed to C: values read for C are either viewed in place in
//     memory outside the Go heap (the store's segment and staging pool)
//     or copied into C.malloc memory the caller frees.
//   - Engine segment and batch handles are the engine's own (a slot and a
//     generation), passed through unchanged.
//   - Every failure returns a negative code: engine calls the codes of
//     Mooncake's transfer engine error.h (engineCode), store calls the
//     store's codes (store/errcode) unchanged (storeCode); the message
//     goes to a thread-local buffer in C (errbuf.c), read with
//     crescent_last_error(). An exported function runs on the calling C
//     thread, so the thread-local is the caller's.
//   - Arrays given by C are bounded (maxItems) before any Go memory is
//     allocated for them.
//   - A store handle is a real client (crescent_store_create: a
//     store.Client) or a dummy client of one on this host
//     (crescent_store_dial_local: a local.Dummy); one interface (kv)
//     serves both, so every store export works on either. A dummy's
//     get_buffer views the real client's shared hot cache in place; what
//     a dummy cannot do is CRESCENT_NOT_SUPPORTED.
//   - crescent_store_alloc_buffer maps a memfd pool registered with the
//     client (a dummy passes its memfd to the real client), so put_from
//     and get_into in it copy nothing in either mode; the pools are
//     unmapped at free_buffer or when the store closes.
//   - The library's logs (slog on stderr, etcd's and gRPC's included)
//     start at level warn in text; CRESCENT_LOG_LEVEL=debug|info|warn|error
//     and CRESCENT_LOG_FORMAT=text|json change that.
//   - CRESCENT_CPUPROFILE=file writes a Go CPU profile from load for
//     CRESCENT_CPUPROFILE_SECONDS (30): `go tool pprof libcrescent.so file`.
//
// The exports are thin (exports_*.go): they convert C types and call the
// Go core (core_*.go), which the package's Go tests exercise directly
// (cgo is not allowed in test files).
package main
