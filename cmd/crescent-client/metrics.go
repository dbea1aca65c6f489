package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/crescent-kv/crescent/store"
)

// newHandler serves /metrics, /metrics/summary and /health for c.
func newHandler(c *store.Client, started time.Time) http.Handler {
	reg := prometheus.NewRegistry() // not the global one: tests run several daemons' handlers
	reg.MustRegister(newCollector(c), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /metrics/summary", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, summary(c, time.Since(started)))
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := c.Ready(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "master unreachable: %v\n", err)
			return
		}
		fmt.Fprintln(w, "OK")
	})
	return mux
}

// collector turns the client's Stats into Prometheus metrics at scrape
// time, so the data path pays only for its atomic counters.
type collector struct {
	c                                        *store.Client
	readBytes, writeBytes, stagedBytes       *prometheus.Desc
	puts, putFail, gets, getFail             *prometheus.Desc
	putLat, getLat, batchPutLat, batchGetLat *prometheus.Desc
	rpcCount, rpcFail, rpcLat                *prometheus.Desc
	heartbeats, heartbeatFail, remounts      *prometheus.Desc
	segmentBytes, stagingBytes               *prometheus.Desc
	underReplicated, putRetries              *prometheus.Desc
	leaderSwitches, staleViews, leaderView   *prometheus.Desc
}

func newCollector(c *store.Client) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &collector{
		c:             c,
		readBytes:     d("crescent_transfer_read_bytes_total", "Value bytes read from replicas (engine transfers and local copies)."),
		writeBytes:    d("crescent_transfer_write_bytes_total", "Value bytes written to replicas (engine transfers and local copies)."),
		stagedBytes:   d("crescent_transfer_staged_bytes_total", "Bytes copied through staging buffers (caller memory not registered)."),
		puts:          d("crescent_client_put_total", "Objects put (batch items included)."),
		putFail:       d("crescent_client_put_failures_total", "Objects whose put failed."),
		gets:          d("crescent_client_get_total", "Objects read (batch items included)."),
		getFail:       d("crescent_client_get_failures_total", "Objects whose get failed."),
		putLat:        d("crescent_transfer_put_latency_seconds", "Put latency."),
		getLat:        d("crescent_transfer_get_latency_seconds", "Get latency."),
		batchPutLat:   d("crescent_transfer_batch_put_latency_seconds", "Batch put latency."),
		batchGetLat:   d("crescent_transfer_batch_get_latency_seconds", "Batch get latency."),
		rpcCount:      d("crescent_client_rpc_count_total", "RPCs sent to the master.", "rpc_name"),
		rpcFail:       d("crescent_client_rpc_failures_total", "RPCs to the master that failed.", "rpc_name"),
		rpcLat:        d("crescent_client_rpc_latency_seconds", "Latency of RPCs to the master.", "rpc_name"),
		heartbeats:    d("crescent_client_heartbeats_total", "Heartbeats (Ping) sent."),
		heartbeatFail: d("crescent_client_heartbeat_failures_total", "Heartbeats that failed."),
		remounts:      d("crescent_client_remounts_total", "Re-mounts after NEED_REMOUNT."),
		segmentBytes:  d("crescent_client_segment_bytes", "Memory mounted on the master."),
		stagingBytes:  d("crescent_client_staging_bytes", "Size of the staging buffer pool."),
		underReplicated: d("crescent_client_under_replicated_puts_total",
			"Puts stored with fewer replicas than asked (at least ReplicateConfig.MinReplicas)."),
		putRetries:     d("crescent_client_put_retries_total", "Puts placed again after a write to a segment failed."),
		leaderSwitches: d("crescent_client_leader_switches_total", "Switches to a new master leader (HA)."),
		staleViews:     d("crescent_client_stale_leader_views_total", "Leader views ignored for a version below the current one (HA)."),
		leaderView:     d("crescent_client_leader_view_version", "View version (fencing term) of the master leader followed (HA; 0 without)."),
	}
}

func (col *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		col.readBytes, col.writeBytes, col.stagedBytes, col.puts, col.putFail, col.gets, col.getFail,
		col.putLat, col.getLat, col.batchPutLat, col.batchGetLat, col.rpcCount, col.rpcFail, col.rpcLat,
		col.heartbeats, col.heartbeatFail, col.remounts, col.segmentBytes, col.stagingBytes,
		col.underReplicated, col.putRetries, col.leaderSwitches, col.staleViews, col.leaderView,
	} {
		ch <- d
	}
}

func (col *collector) Collect(ch chan<- prometheus.Metric) {
	s := col.c.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(col.readBytes, s.BytesRead)
	counter(col.writeBytes, s.BytesWritten)
	counter(col.stagedBytes, s.StagedBytes)
	counter(col.puts, s.Puts)
	counter(col.putFail, s.PutFailures)
	counter(col.gets, s.Gets)
	counter(col.getFail, s.GetFailures)
	counter(col.heartbeats, s.Heartbeats)
	counter(col.heartbeatFail, s.HeartbeatFailures)
	counter(col.remounts, s.Remounts)
	counter(col.underReplicated, s.UnderReplicatedPuts)
	counter(col.putRetries, s.PutRetries)
	counter(col.leaderSwitches, s.LeaderSwitches)
	counter(col.staleViews, s.StaleLeaderViews)
	ch <- prometheus.MustNewConstMetric(col.leaderView, prometheus.GaugeValue, float64(s.LeaderVersion))
	ch <- prometheus.MustNewConstMetric(col.segmentBytes, prometheus.GaugeValue, float64(s.SegmentBytes))
	ch <- prometheus.MustNewConstMetric(col.stagingBytes, prometheus.GaugeValue, float64(s.StagingBytes))
	ch <- histogram(col.putLat, s.PutLatency)
	ch <- histogram(col.getLat, s.GetLatency)
	ch <- histogram(col.batchPutLat, s.BatchPutLatency)
	ch <- histogram(col.batchGetLat, s.BatchGetLatency)
	for name, r := range s.RPC {
		counter(col.rpcCount, r.Calls, name)
		counter(col.rpcFail, r.Failures, name)
		ch <- histogram(col.rpcLat, r.Latency, name)
	}
}

// histogram converts a store histogram (per-bucket counts) to Prometheus'
// cumulative buckets in seconds.
func histogram(d *prometheus.Desc, h store.Histogram, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.Bounds))
	var cum uint64
	for i, b := range h.Bounds {
		cum += h.Counts[i]
		buckets[b.Seconds()] = cum
	}
	return prometheus.MustNewConstHistogram(d, h.Count, h.Sum.Seconds(), buckets, labels...)
}

// summary is the human-readable page, in the reference client's layout.
func summary(c *store.Client, uptime time.Duration) string {
	s := c.Stats()
	var b strings.Builder
	secs := max(uptime.Seconds(), 1e-9)
	fmt.Fprintf(&b, "=== Crescent client %s (segment %s), up %s ===\n", c.ID(), c.SegmentName(), uptime.Round(time.Second))
	fmt.Fprintf(&b, "Mounted: %s   Staging pool: %s\n", bytesStr(float64(s.SegmentBytes)), bytesStr(float64(s.StagingBytes)))
	fmt.Fprintf(&b, "Heartbeats: %d (failed %d), re-mounts: %d\n", s.Heartbeats, s.HeartbeatFailures, s.Remounts)
	b.WriteString("\n=== Transfer Metrics Summary ===\n")
	fmt.Fprintf(&b, "Total Read: %s\nTotal Write: %s\nStaged: %s\n", bytesStr(float64(s.BytesRead)), bytesStr(float64(s.BytesWritten)), bytesStr(float64(s.StagedBytes)))
	fmt.Fprintf(&b, "Average Read Throughput: %s/s\nAverage Write Throughput: %s/s\n", bytesStr(float64(s.BytesRead)/secs), bytesStr(float64(s.BytesWritten)/secs))
	fmt.Fprintf(&b, "Puts: %d (failed %d)   Gets: %d (failed %d)\n", s.Puts, s.PutFailures, s.Gets, s.GetFailures)
	fmt.Fprintf(&b, "Puts under-replicated: %d   placed again after a failed write: %d\n", s.UnderReplicatedPuts, s.PutRetries)
	b.WriteString("\n=== Latency Summary ===\n")
	for _, l := range []struct {
		name string
		h    store.Histogram
	}{{"Get", s.GetLatency}, {"Put", s.PutLatency}, {"Batch Get", s.BatchGetLatency}, {"Batch Put", s.BatchPutLatency}} {
		fmt.Fprintf(&b, "%s: %s\n", l.name, latencyStr(l.h))
	}
	b.WriteString("\n=== RPC Metrics Summary ===\n")
	names := make([]string, 0, len(s.RPC))
	for n, r := range s.RPC {
		if r.Calls > 0 {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		b.WriteString("No RPC calls recorded\n")
	}
	for _, n := range names {
		r := s.RPC[n]
		fmt.Fprintf(&b, "%s: failures=%d, %s\n", n, r.Failures, latencyStr(r.Latency))
	}
	return b.String()
}

func latencyStr(h store.Histogram) string {
	if h.Count == 0 {
		return "No data"
	}
	return fmt.Sprintf("count=%d, mean=%v, p50<%v, p95<%v, p99<%v", h.Count, (h.Sum / time.Duration(h.Count)).Round(time.Microsecond),
		h.Quantile(0.5), h.Quantile(0.95), h.Quantile(0.99))
}

func bytesStr(v float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", v)
	}
	return fmt.Sprintf("%.2f %s", v, units[i])
}
