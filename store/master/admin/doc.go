// Package admin is the master's admin HTTP surface and its Prometheus
// metrics, over a store/master.Master and its store/master/service.Service.
//
// Handler serves / (the status page: one self-contained HTML file,
// status.html, embedded; no external assets; it fetches status.json
// every 2 s and derives put/get rates from two samples), /status.json
// (Status: role and term, keys, segments with their usage, clients
// numbered 1..n, cumulative put and get counts, eviction counters; no
// client ids, credentials or tokens; role "single" unless WithRole),
// /metrics (Prometheus, from the registry given),
// /metrics/summary (human-readable text), /health (OK, or 503 with the
// cause once the operation log failed), /query_key?key= (JSON),
// /get_all_keys (text, sorted; one listing at a time, the others wait,
// since each holds every key; a reader that takes nothing for 10 s loses
// the response), /get_all_segments (JSON, suspect segments
// marked), and with WithSnapshotHook POST /snapshot (loopback peers only;
// 409 when the hook returns ErrBusy). Any other path goes to extra, when
// given. The pages that show keys or segments answer only once what they
// read is durable (Service.WaitDurable), 503 when the log failed.
// No page shows a client's session (client ids are public; the session
// that proves one never reaches the master's state).
//
// RequireAdmin guards a handler's mutating requests (any method but GET,
// HEAD, OPTIONS) with the admin token as "Authorization: Bearer <token>"
// (401 without it, 403 when wrong or when no token is configured); reads
// stay open.
//
// Metrics is a prometheus.Collector reading the master's Stats and the
// service's RPC counters at scrape time: gauges and counters named
// master_* (as the reference names them; per RPC
// master_<rpc>_requests_total, _failures_total and, for RPCs that answer
// per item, _items_total and _item_failures_total) and, fed by Observe
// (pass it to service.WithObserver), the latency histogram
// master_rpc_duration_seconds{rpc}. Metric names are a
// contract with dashboards: they do not change.
package admin
