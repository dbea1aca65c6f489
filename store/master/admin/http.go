package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// Metrics exposes a master (and its service's RPC counters) to
// Prometheus, reading them at scrape time.
type Metrics struct {
	m   *master.Master
	svc *service.Service
	lat *prometheus.HistogramVec

	capacity, allocated, keys, pending, softPinned, hardPinned, segments, clients                 *prometheus.Desc
	reservations, reservedBytes, suspects, reports                                                *prometheus.Desc
	evictRuns, evictKeys, evictBytes, expired, discarded, released, dropped, lost                 *prometheus.Desc
	departed, unmountedReplicas, unmountedKeys, grpcHeld, grpcRefused, grpcExhausted, grpcStarved *prometheus.Desc
	// Per RPC, named as the reference does: master_<rpc>_requests_total.
	requests, failures, items, itemFailures map[string]*prometheus.Desc
	durableWaits, durableWaitSeconds        map[string]*prometheus.Desc
}

// NewMetrics returns the collector. Pass its Observe to service.New with
// service.WithObserver to get per-RPC latency histograms.
func NewMetrics(m *master.Master, svc *service.Service) *Metrics {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &Metrics{
		m: m, svc: svc,
		lat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "master_rpc_duration_seconds",
			Help:    "Time to serve a master RPC.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 18),
		}, []string{"rpc"}),
		capacity:           d("master_total_capacity_bytes", "Bytes of all mounted segments."),
		allocated:          d("master_allocated_bytes", "Bytes reserved for replicas."),
		keys:               d("master_key_count", "Objects, finished or not."),
		pending:            d("master_pending_key_count", "Objects between PutStart and PutEnd."),
		softPinned:         d("master_soft_pin_key_count", "Soft-pinned objects."),
		hardPinned:         d("master_hard_pin_key_count", "Hard-pinned objects."),
		segments:           d("master_segment_count", "Mounted segments."),
		clients:            d("master_active_clients", "Clients with mounted segments."),
		reservations:       d("master_reservation_count", "Space placed ahead of puts (ReservePut), not yet committed."),
		reservedBytes:      d("master_reserved_bytes", "Bytes of those reservations (one replica each)."),
		suspects:           d("master_suspect_segment_count", "Segments placement avoids: writes to them failed, their client has not pinged since."),
		reports:            d("master_segment_reports_total", "Segments reported by clients whose writes to them failed."),
		evictRuns:          d("master_eviction_runs_total", "Eviction rounds."),
		evictKeys:          d("master_evicted_keys_total", "Objects evicted."),
		evictBytes:         d("master_evicted_bytes_total", "Bytes freed by eviction."),
		expired:            d("master_expired_clients_total", "Clients dropped for missing heartbeats."),
		departed:           d("master_departed_clients_total", "Clients that unmounted their last segment (a clean departure, not an expiry)."),
		discarded:          d("master_discarded_puts_total", "Unfinished puts taken over after the discard timeout."),
		released:           d("master_released_puts_total", "Unfinished puts freed at the release timeout."),
		dropped:            d("master_dropped_replicas_total", "Replicas lost with the segment of an expired client."),
		lost:               d("master_lost_keys_total", "Objects erased because no replica was left after a client expired."),
		unmountedReplicas:  d("master_unmounted_replicas_total", "Replicas dropped with a segment its client unmounted."),
		unmountedKeys:      d("master_unmounted_keys_total", "Objects erased because their last replica's segment was unmounted."),
		grpcHeld:           d("master_grpc_request_bytes", "Request bytes gRPC holds now, bounded by --crpc_max_buffered_bytes."),
		grpcRefused:        d("master_grpc_refused_calls_total", "gRPC calls refused (REFUSED_STREAM) because the request byte bound was spent."),
		grpcExhausted:      d("master_grpc_exhausted_calls_total", "gRPC calls answered RESOURCE_EXHAUSTED as their headers arrived because the bound on calls open (--crpc_max_calls) was spent."),
		grpcStarved:        d("master_grpc_starved_conns_total", "gRPC connections closed because the client kept a flow-control window shut while answers waited on it for the write timeout."),
		requests:           perRPC("requests_total", "%s RPCs served."),
		failures:           perRPC("failures_total", "%s RPCs answered with an error."),
		items:              perRPC("items_total", "Items of %s batch RPCs."),
		itemFailures:       perRPC("item_failures_total", "Failed items of %s batch RPCs."),
		durableWaits:       perRPC("durable_waits_total", "%s answers that waited for the operation log to make what they changed or read durable."),
		durableWaitSeconds: perRPC("durable_wait_seconds_total", "Time %s answers waited for the operation log (divide by durable_waits_total for the mean)."),
	}
}

// itemRPC reports whether the RPC answers per item.
func itemRPC(name string) bool {
	return strings.HasPrefix(name, "batch_") || name == "reserve_put" || name == "commit_put"
}

func perRPC(suffix, help string) map[string]*prometheus.Desc {
	out := make(map[string]*prometheus.Desc)
	for _, name := range service.RPCNames() {
		out[name] = prometheus.NewDesc("master_"+name+"_"+suffix, fmt.Sprintf(help, name), nil, nil)
	}
	return out
}

// Observe records one RPC's latency; hand it to WithObserver.
func (x *Metrics) Observe(rpc string, d time.Duration, _ error) {
	x.lat.WithLabelValues(rpc).Observe(d.Seconds())
}

// Describe implements prometheus.Collector.
func (x *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{x.capacity, x.allocated, x.keys, x.pending, x.softPinned, x.hardPinned, x.segments, x.clients,
		x.reservations, x.reservedBytes, x.suspects, x.reports, x.evictRuns, x.evictKeys, x.evictBytes, x.expired, x.discarded, x.released, x.dropped, x.lost,
		x.departed, x.unmountedReplicas, x.unmountedKeys, x.grpcHeld, x.grpcRefused, x.grpcExhausted, x.grpcStarved} {
		ch <- d
	}
	for _, m := range []map[string]*prometheus.Desc{x.requests, x.failures, x.items, x.itemFailures, x.durableWaits, x.durableWaitSeconds} {
		for _, d := range m {
			ch <- d
		}
	}
	x.lat.Describe(ch)
}

// Collect implements prometheus.Collector.
func (x *Metrics) Collect(ch chan<- prometheus.Metric) {
	s := x.m.Stats()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	cf := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	c := func(d *prometheus.Desc, v uint64) { cf(d, float64(v)) }
	g(x.capacity, float64(s.Capacity))
	g(x.allocated, float64(s.Allocated))
	g(x.keys, float64(s.Keys))
	g(x.pending, float64(s.PendingKeys))
	g(x.softPinned, float64(s.SoftPinnedKeys))
	g(x.hardPinned, float64(s.HardPinnedKeys))
	g(x.segments, float64(s.Segments))
	g(x.clients, float64(s.ActiveClients))
	g(x.reservations, float64(s.Reservations))
	g(x.reservedBytes, float64(s.ReservedBytes))
	g(x.suspects, float64(s.SuspectSegments))
	c(x.reports, s.SegmentReports)
	c(x.evictRuns, s.EvictionRuns)
	c(x.evictKeys, s.EvictedKeys)
	c(x.evictBytes, s.EvictedBytes)
	c(x.expired, s.ExpiredClients)
	c(x.discarded, s.DiscardedPuts)
	c(x.released, s.ReleasedPuts)
	c(x.dropped, s.DroppedReplicas)
	c(x.lost, s.LostKeys)
	c(x.departed, s.DepartedClients)
	c(x.unmountedReplicas, s.UnmountedReplicas)
	c(x.unmountedKeys, s.UnmountedKeys)
	if x.svc != nil {
		held, refused := x.svc.GRPCRequestBytes()
		g(x.grpcHeld, float64(held))
		c(x.grpcRefused, uint64(refused))
		c(x.grpcExhausted, uint64(x.svc.GRPCCallsRefused()))
		c(x.grpcStarved, uint64(x.svc.GRPCWindowsStarved()))
		for _, r := range x.svc.Counts() {
			c(x.requests[r.Name], r.Requests)
			c(x.failures[r.Name], r.Failures)
			if itemRPC(r.Name) {
				c(x.items[r.Name], r.Items)
				c(x.itemFailures[r.Name], r.ItemFailures)
			}
			if r.DurableWaits > 0 {
				c(x.durableWaits[r.Name], r.DurableWaits)
				cf(x.durableWaitSeconds[r.Name], float64(r.DurableWaitNanos)/1e9)
			}
		}
	}
	x.lat.Collect(ch)
}

// Handler serves the master's HTTP admin endpoints: / (the status page,
// refreshing itself from /status.json), /metrics (Prometheus, reg), /metrics/summary (text), /health, /query_key?key=,
// /get_all_keys, /get_all_segments, and with WithSnapshotHook POST
// /snapshot. extra, when set, receives every other path (the engine's
// HTTP metadata store at /metadata, for example).
//
// The pages that show keys or segments answer, like the RPCs, only once
// what they read is durable (service.Service.WaitDurable), so they never show a
// change a crash would take back; 503 when the log failed.
func Handler(m *master.Master, svc *service.Service, reg *prometheus.Registry, extra http.Handler, opts ...Option) http.Handler {
	mux := http.NewServeMux()
	o := options{mux: mux, role: func() Role { return Single }, listingStall: listingStall}
	for _, opt := range opts {
		opt(&o)
	}
	durable := func(w http.ResponseWriter, r *http.Request) bool {
		if err := svc.WaitDurable(r.Context()); err != nil {
			http.Error(w, "operation log not durable: "+err.Error(), http.StatusServiceUnavailable)
			return false
		}
		return true
	}
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/metrics/summary", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		writeSummary(w, m, svc)
	})
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := svc.Healthy(); err != nil {
			// Fail-stop: nothing more is acknowledged.
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "UNAVAILABLE:", err)
			return
		}
		fmt.Fprintln(w, "OK")
	})
	mux.HandleFunc("/query_key", func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("key")
		if key == "" {
			http.Error(w, "missing ?key=", http.StatusBadRequest)
			return
		}
		info, err := m.QueryKey(key)
		if !durable(w, r) {
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		writeJSON(w, keyJSON(info))
	})
	// Key listings run one at a time: each holds a list of every key (16
	// MB per million keys) and walks every shard, and the port takes
	// hundreds of connections.
	listing := make(chan struct{}, 1)
	mux.HandleFunc("/get_all_keys", func(w http.ResponseWriter, r *http.Request) {
		select {
		case listing <- struct{}{}:
		case <-r.Context().Done():
			return
		}
		defer func() { <-listing }()
		keys := m.AllKeys()
		if o.listed != nil {
			o.listed()
		}
		if !durable(w, r) {
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		sort.Strings(keys)
		// A reader that stops reading would hold the listing (and every
		// listing waiting for it) for ever: each piece must be taken
		// within listingStall.
		rc := http.NewResponseController(w)
		bw := bufio.NewWriterSize(w, 64<<10)
		for i, k := range keys {
			if i%1024 == 0 {
				rc.SetWriteDeadline(time.Now().Add(o.listingStall))
			}
			bw.WriteString(k)
			if err := bw.WriteByte('\n'); err != nil {
				return
			}
		}
		bw.Flush()
	})
	mux.HandleFunc("/get_all_segments", func(w http.ResponseWriter, r *http.Request) {
		segs := m.AllSegments()
		if !durable(w, r) {
			return
		}
		out := make([]map[string]any, 0, len(segs))
		for _, s := range segs {
			out = append(out, map[string]any{
				"name": s.Name, "id": uuidString(s.ID), "client": uuidString(s.Client), "base": s.Base,
				"capacity": s.Capacity, "used": s.Used, "allocations": s.Allocs, "largest_free": s.LargestFree,
				"protocol": s.Protocol, "status": s.Status.String(), "suspect": s.Suspect,
			})
		}
		writeJSON(w, out)
	})
	mux.Handle("/{$}", StatusPage())
	mux.HandleFunc("/status.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, StatusOf(m, svc, o.role()))
	})
	if extra != nil {
		mux.Handle("/", extra)
	}
	return mux
}

// Option adds an endpoint to Handler or sets what it reports.
type Option func(*options)

type options struct {
	mux    *http.ServeMux
	role   func() Role
	listed func() // tests: a key listing holds its keys
	// listingStall bounds how long a key listing waits for its reader
	// to take the next piece (listingStall by default).
	listingStall time.Duration
}

const listingStall = 10 * time.Second

// SnapshotInfo is what POST /snapshot answers.
type SnapshotInfo struct {
	ID             string  `json:"id"`
	Seq            uint64  `json:"seq"`
	Size           int64   `json:"size"`
	TookMs         float64 `json:"took_ms"`
	LongestPauseMs float64 `json:"longest_pause_ms"`
	// ScratchLongestHoldMs, ScratchLongestShardHoldMs: the longest one
	// lock, and one shard's, of the replica the snapshot was exported
	// from was held.
	ScratchLongestHoldMs      float64 `json:"scratch_longest_hold_ms"`
	ScratchLongestShardHoldMs float64 `json:"scratch_longest_shard_hold_ms"`
	Unchanged                 bool    `json:"unchanged,omitempty"` // nothing new since the latest snapshot
}

// answerWithin bounds the write of an answer that follows a long wait.
const answerWithin = 10 * time.Second

// ErrBusy, from an admin hook, answers 409 Conflict.
var ErrBusy = errors.New("master: busy")

// WithSnapshotHook serves POST /snapshot: take runs a snapshot now. Only
// loopback peers may call it (admin operations need a credential, and
// none is configured on this port); a snapshot already running answers
// 409 (take returns ErrBusy).
func WithSnapshotHook(take func(context.Context) (SnapshotInfo, error)) Option {
	return func(o *options) {
		o.mux.HandleFunc("/snapshot", func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				w.Header().Set("Allow", http.MethodPost)
				http.Error(w, "POST only", http.StatusMethodNotAllowed)
				return
			}
			if host, _, err := net.SplitHostPort(r.RemoteAddr); err != nil || !net.ParseIP(host).IsLoopback() {
				http.Error(w, "admin operations are served to loopback peers only", http.StatusForbidden)
				return
			}
			info, err := take(r.Context())
			// A snapshot may outlast the port's write timeout, counted
			// from the request: give the answer its own.
			http.NewResponseController(w).SetWriteDeadline(time.Now().Add(answerWithin))
			switch {
			case errors.Is(err, ErrBusy):
				http.Error(w, err.Error(), http.StatusConflict)
			case err != nil:
				http.Error(w, err.Error(), http.StatusInternalServerError)
			default:
				writeJSON(w, info)
			}
		})
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func uuidString(u master.UUID) string { return fmt.Sprintf("%016x%016x", u.Hi, u.Lo) }

func keyJSON(k master.KeyInfo) map[string]any {
	reps := make([]map[string]any, 0, len(k.Replicas))
	for _, r := range k.Replicas {
		reps = append(reps, map[string]any{
			"type": r.Type.String(), "status": r.Status.String(), "segment": r.SegmentName,
			"address": r.Addr, "size": r.Size, "protocol": r.Protocol,
		})
	}
	out := map[string]any{
		"key": k.Key, "size": k.Size, "complete": k.Complete, "replicas": reps,
		"leased": k.Leased, "soft_pin": k.SoftPin, "hard_pin": k.HardPin,
	}
	if !k.LeaseDeadline.IsZero() {
		out["lease_deadline"] = k.LeaseDeadline.Format(time.RFC3339Nano)
	}
	if !k.SoftPinDeadline.IsZero() {
		out["soft_pin_deadline"] = k.SoftPinDeadline.Format(time.RFC3339Nano)
	}
	if !k.Complete {
		out["owner"] = uuidString(k.Owner)
		out["started"] = k.Started.Format(time.RFC3339Nano)
	}
	return out
}

// writeSummary prints the human-readable /metrics/summary page.
func writeSummary(w http.ResponseWriter, m *master.Master, svc *service.Service) {
	s := m.Stats()
	pct := 0.0
	if s.Capacity > 0 {
		pct = 100 * float64(s.Allocated) / float64(s.Capacity)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Crescent master (view %d)\n", m.ViewVersion())
	fmt.Fprintf(&b, "Storage: %s / %s allocated (%.1f%%), %d segments, %d active clients\n",
		bytesString(s.Allocated), bytesString(s.Capacity), pct, s.Segments, s.ActiveClients)
	fmt.Fprintf(&b, "Keys: %d (%d unfinished, %d soft-pinned, %d hard-pinned)\n", s.Keys, s.PendingKeys, s.SoftPinnedKeys, s.HardPinnedKeys)
	fmt.Fprintf(&b, "Eviction: %d runs, %d keys, %s freed\n", s.EvictionRuns, s.EvictedKeys, bytesString(s.EvictedBytes))
	fmt.Fprintf(&b, "Liveness: %d clients expired, %d replicas dropped, %d keys lost\n", s.ExpiredClients, s.DroppedReplicas, s.LostKeys)
	fmt.Fprintf(&b, "Departures: %d clients unmounted their last segment, %d replicas and %d keys went with them\n",
		s.DepartedClients, s.UnmountedReplicas, s.UnmountedKeys)
	fmt.Fprintf(&b, "Unfinished puts: %d taken over, %d released\n", s.DiscardedPuts, s.ReleasedPuts)
	fmt.Fprintf(&b, "Put-ahead reservations: %d (%s)\n", s.Reservations, bytesString(s.ReservedBytes))
	fmt.Fprintf(&b, "Suspect segments: %d (%d failed-write reports)\n", s.SuspectSegments, s.SegmentReports)
	if svc != nil {
		b.WriteString("RPCs (requests / failures):\n")
		for _, r := range svc.Counts() {
			if r.Requests == 0 {
				continue
			}
			fmt.Fprintf(&b, "  %-22s %10d / %d", r.Name, r.Requests, r.Failures)
			if r.Items > 0 {
				fmt.Fprintf(&b, "   items %d / %d failed", r.Items, r.ItemFailures)
			}
			b.WriteByte('\n')
		}
	}
	w.Write([]byte(b.String()))
}

func bytesString(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
