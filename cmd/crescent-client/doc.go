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
package main
