package store

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/store/storepb"
)

// LatencyBounds are the upper bounds of the latency histograms: the
// reference client's buckets (fine below 1 ms, a long tail up to 20 s).
var LatencyBounds = []time.Duration{
	50 * time.Microsecond, 75 * time.Microsecond, 125 * time.Microsecond, 150 * time.Microsecond,
	200 * time.Microsecond, 250 * time.Microsecond, 300 * time.Microsecond, 400 * time.Microsecond,
	500 * time.Microsecond, 750 * time.Microsecond, time.Millisecond,
	1500 * time.Microsecond, 2 * time.Millisecond, 3 * time.Millisecond, 5 * time.Millisecond,
	7 * time.Millisecond, 15 * time.Millisecond, 20 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 20 * time.Second,
}

// Histogram is a snapshot of a latency histogram.
type Histogram struct {
	// Bounds are the buckets' upper bounds (LatencyBounds).
	Bounds []time.Duration
	// Counts has len(Bounds)+1 entries: Counts[i] observations in
	// (Bounds[i-1], Bounds[i]], the last one above every bound.
	Counts []uint64
	Count  uint64
	Sum    time.Duration
}

// Quantile returns the upper bound of the bucket holding quantile q (0..1),
// 0 when empty, and the largest bound when q falls in the overflow bucket.
func (h Histogram) Quantile(q float64) time.Duration {
	if h.Count == 0 {
		return 0
	}
	target := uint64(math.Ceil(q * float64(h.Count)))
	if target == 0 {
		target = 1
	}
	var cum uint64
	for i, n := range h.Counts {
		cum += n
		if cum >= target {
			if i < len(h.Bounds) {
				return h.Bounds[i]
			}
			break
		}
	}
	return h.Bounds[len(h.Bounds)-1]
}

type histogram struct {
	counts []atomic.Uint64
	count  atomic.Uint64
	sum    atomic.Int64
}

func newHistogram() *histogram {
	return &histogram{counts: make([]atomic.Uint64, len(LatencyBounds)+1)}
}

func (h *histogram) observe(d time.Duration) {
	// Binary search: 27 bounds, ~5 comparisons.
	lo, hi := 0, len(LatencyBounds)
	for lo < hi {
		m := (lo + hi) / 2
		if d <= LatencyBounds[m] {
			hi = m
		} else {
			lo = m + 1
		}
	}
	h.counts[lo].Add(1)
	h.count.Add(1)
	h.sum.Add(int64(d))
}

func (h *histogram) snapshot() Histogram {
	s := Histogram{Bounds: LatencyBounds, Counts: make([]uint64, len(h.counts))}
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i]
	}
	s.Sum = time.Duration(h.sum.Load())
	return s
}

// RPCStats counts calls of one master RPC.
type RPCStats struct {
	Calls, Failures uint64
	Latency         Histogram
}

// Stats is a snapshot of a client's counters.
type Stats struct {
	// BytesWritten and BytesRead count value bytes moved to and from
	// replicas: engine transfers plus copies to/from this client's own
	// segment.
	BytesWritten, BytesRead uint64
	// StagedBytes counts bytes copied through staging buffers because the
	// caller's memory was not registered.
	StagedBytes uint64
	// Puts and Gets count objects (batch items included); the failures
	// count those that ended in an error.
	Puts, PutFailures, Gets, GetFailures uint64
	// Latencies of Put/PutFrom, Get/GetInto/GetBuffer and of batch calls.
	PutLatency, GetLatency, BatchPutLatency, BatchGetLatency Histogram
	// RPC holds per-method counters, keyed by the RPC's name ("PutStart").
	RPC map[string]RPCStats
	// PutsAhead counts puts done in one round trip (CommitPut of a
	// reservation); AheadGone those that found their reservation gone and
	// took the two-RPC path.
	PutsAhead, AheadGone uint64
	// LocationHits counts gets (batch items included) read from a cached
	// location without asking the master; LocationMisses those that asked
	// while the cache was on (Config.LocationCache).
	LocationHits, LocationMisses uint64
	// StoredReplicas[n] counts the puts stored with n replicas (the last
	// entry: MaxCountedReplicas or more); UnderReplicatedPuts those
	// stored with fewer than ReplicateConfig.Replicas asked.
	StoredReplicas      [MaxCountedReplicas + 1]uint64
	UnderReplicatedPuts uint64
	// PutRetries counts puts placed again after a write to a segment
	// failed; FailedSegmentReports the segments reported to the master
	// for it.
	PutRetries, FailedSegmentReports uint64
	// Heartbeats sent, failed, and re-mounts after NEED_REMOUNT.
	Heartbeats, HeartbeatFailures, Remounts uint64
	// SegmentBytes is the memory mounted on the master; StagingBytes the
	// staging pool's size.
	SegmentBytes, StagingBytes uint64
	// HA (MasterAddr etcd:// or redis://): the leader followed and its
	// view version; LeaderSwitches counts switches to a new leader,
	// StaleLeaderViews views ignored for a version below the current
	// one, LeaderRetries idempotent calls sent again after UNAVAILABLE.
	Leader                                          string
	LeaderVersion                                   uint64
	LeaderSwitches, StaleLeaderViews, LeaderRetries uint64
}

type stats struct {
	written, read, staged                    atomic.Uint64
	puts, putFail, gets, getFail             atomic.Uint64
	putLat, getLat, batchPutLat, batchGetLat *histogram
	heartbeats, heartbeatFail, remounts      atomic.Uint64
	putsAhead, aheadGone                     atomic.Uint64
	locHits, locMisses                       atomic.Uint64
	storedReps                               [MaxCountedReplicas + 1]atomic.Uint64
	underReplicated, putRetries, segReports  atomic.Uint64
	rpc                                      map[string]*rpcCounter // fixed at creation: read without locks
}

type rpcCounter struct {
	calls, failures atomic.Uint64
	lat             *histogram
}

func newStats() *stats {
	s := &stats{
		putLat: newHistogram(), getLat: newHistogram(), batchPutLat: newHistogram(), batchGetLat: newHistogram(),
		rpc: make(map[string]*rpcCounter),
	}
	for _, m := range storepb.Master_ServiceDesc.Methods {
		s.rpc[m.MethodName] = &rpcCounter{lat: newHistogram()}
	}
	return s
}

// interceptor counts every unary call to the master.
func (s *stats) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	start := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if rc := s.rpc[method[strings.LastIndexByte(method, '/')+1:]]; rc != nil {
		rc.calls.Add(1)
		if err != nil {
			rc.failures.Add(1)
		}
		rc.lat.observe(time.Since(start))
	}
	return err
}

func (s *stats) snapshot() Stats {
	st := Stats{
		BytesWritten: s.written.Load(), BytesRead: s.read.Load(), StagedBytes: s.staged.Load(),
		Puts: s.puts.Load(), PutFailures: s.putFail.Load(), Gets: s.gets.Load(), GetFailures: s.getFail.Load(),
		PutLatency: s.putLat.snapshot(), GetLatency: s.getLat.snapshot(),
		BatchPutLatency: s.batchPutLat.snapshot(), BatchGetLatency: s.batchGetLat.snapshot(),
		PutsAhead: s.putsAhead.Load(), AheadGone: s.aheadGone.Load(),
		LocationHits: s.locHits.Load(), LocationMisses: s.locMisses.Load(),
		UnderReplicatedPuts: s.underReplicated.Load(), PutRetries: s.putRetries.Load(), FailedSegmentReports: s.segReports.Load(),
		Heartbeats: s.heartbeats.Load(), HeartbeatFailures: s.heartbeatFail.Load(), Remounts: s.remounts.Load(),
		RPC: make(map[string]RPCStats, len(s.rpc)),
	}
	for i := range s.storedReps {
		st.StoredReplicas[i] = s.storedReps[i].Load()
	}
	for name, rc := range s.rpc {
		st.RPC[name] = RPCStats{Calls: rc.calls.Load(), Failures: rc.failures.Load(), Latency: rc.lat.snapshot()}
	}
	return st
}

// countOps records n operations of one kind, failed of them in error.
func countOps(total, fail *atomic.Uint64, n, failed int) {
	total.Add(uint64(n))
	fail.Add(uint64(failed))
}

// MaxCountedReplicas is the last replica count Stats.StoredReplicas tells
// apart.
const MaxCountedReplicas = 16

// stored counts a put stored with n replicas of the asked ones.
func (s *stats) stored(n int, asked uint32) {
	s.storedReps[min(n, MaxCountedReplicas)].Add(1)
	if n < int(max(asked, 1)) {
		s.underReplicated.Add(1)
	}
}
