// Command crescent-client is the store's client daemon: it contributes
// memory to the pool (a segment mounted on the master), keeps it mounted
// with heartbeats, and serves its own metrics.
//
//	crescent-client --master_server_address 127.0.0.1:50051 --global_segment_size "4 GB"
//
// HTTP on --metrics_port: /metrics (Prometheus), /metrics/summary (text),
// /health (200, or 503 when the master does not answer). SIGTERM or SIGINT
// unmounts the segment, then exits 0.
package main
