// Command crescent-client is the store's client daemon: it contributes
// memory to the pool (a segment mounted on the master), keeps it mounted
// with heartbeats, and serves its own metrics.
//
//	crescent-client --master_server_address 127.0.0.1:50051 --global_segment_size "4 GB"
//
// With masters in HA, --master_server_address names where their leader
// view lives, etcd://h:p[,h2:p2] or redis://h:p (and --cluster_id their
// --cluster_id): the client follows the leader (package store, "Masters in
// high availability").
//
// HTTP on --metrics_port: /metrics (Prometheus), /metrics/summary (text),
// /health (200, or 503 when the master does not answer). SIGTERM or SIGINT
// unmounts the segment, then exits 0.
//
// Before anything is allocated, --global_segment_size plus
// --local_buffer_size are checked against the memory available
// (MemAvailable in /proc/meminfo and the process's memory cgroup limit
// minus its use); a larger request exits 1 with an error naming both
// flags and what is available, since prefaulting it would end in the OOM
// killer. --allow_overcommit skips the check.
//
// --local_socket PATH serves the inference processes of this host as
// dummy clients (package store/local): SO_PEERCRED (this uid and
// --local_allow_uids) plus a per-dummy token, socket mode
// --local_socket_mode (0600). The hot cache takes its size, block size
// and sharing from --local_hot_cache_size, --local_hot_block_size and
// --local_hot_cache_shm, else from MC_STORE_LOCAL_HOT_CACHE_SIZE,
// MC_STORE_LOCAL_HOT_BLOCK_SIZE, MC_STORE_LOCAL_HOT_CACHE_USE_SHM and
// MC_STORE_LOCAL_HOT_ADMISSION_THRESHOLD; its counters and the dummies'
// are on /metrics (crescent_local_*, crescent_hot_cache_*) and
// /metrics/summary. SIGTERM disconnects the dummies before unmounting.
//
// --token_file and --tls_ca/--tls_cert/--tls_key are the master's
// credentials (security.go). Without a credential the metrics port admits
// loopback peers only (one log line says so); --insecure opens it, and is
// refused together with a credential. The transfer engine's own ports
// are the engine's to protect.
package main
