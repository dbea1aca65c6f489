package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/local"
)

// localOptions are the flags of the local socket (dummy clients) and the
// hot cache; the cache's defaults come from the reference's
// MC_STORE_LOCAL_HOT_* variables.
type localOptions struct {
	socket    string
	mode      string
	allowUIDs string
	cacheSize string
	blockSize string
	shm       bool
	shmSet    bool
}

func registerLocalFlags(fs *flag.FlagSet, o *localOptions) {
	fs.StringVar(&o.socket, "local_socket", "", "Unix socket path serving dummy clients on this host (empty: none)")
	fs.StringVar(&o.mode, "local_socket_mode", "0600", "permission bits of the local socket (SO_PEERCRED and a per-dummy token decide in any case)")
	fs.StringVar(&o.allowUIDs, "local_allow_uids", "", "comma-separated uids allowed as dummies besides this process's own")
	fs.StringVar(&o.cacheSize, "local_hot_cache_size", "", "hot cache size, e.g. 256MB (default "+local.EnvCacheSize+", else 0 = no cache)")
	fs.StringVar(&o.blockSize, "local_hot_block_size", "", "hot cache block size (default "+local.EnvBlockSize+", else 16MB)")
	fs.Func("local_hot_cache_shm", "share the hot cache with dummies: zero-copy hits (default "+local.EnvUseShm+")", func(s string) error {
		b, err := strconv.ParseBool(s)
		o.shm, o.shmSet = b, true
		return err
	})
}

// localOpts turns the flags (over the environment) into Options.
func (o localOptions) localOpts(log *slog.Logger) (local.Options, error) {
	var lo local.Options
	if err := lo.ApplyEnv(); err != nil {
		return lo, err
	}
	var err error
	if o.cacheSize != "" {
		if lo.CacheSize, err = local.ParseSize(o.cacheSize); err != nil {
			return lo, fmt.Errorf("--local_hot_cache_size: %w", err)
		}
	}
	if o.blockSize != "" {
		if lo.BlockSize, err = local.ParseSize(o.blockSize); err != nil || lo.BlockSize <= 0 {
			return lo, fmt.Errorf("--local_hot_block_size %q: not a positive size", o.blockSize)
		}
	}
	if o.shmSet {
		lo.Shm = o.shm
	}
	m, err := strconv.ParseUint(o.mode, 8, 32)
	if err != nil || m > 0o777 {
		return lo, fmt.Errorf("--local_socket_mode %q: not octal permission bits", o.mode)
	}
	lo.SocketMode = os.FileMode(m)
	for _, u := range strings.Split(o.allowUIDs, ",") {
		if u = strings.TrimSpace(u); u == "" {
			continue
		}
		n, err := strconv.ParseUint(u, 10, 32)
		if err != nil {
			return lo, fmt.Errorf("--local_allow_uids: %q is not a uid", u)
		}
		lo.AllowUIDs = append(lo.AllowUIDs, uint32(n))
	}
	lo.Logger = log
	return lo, nil
}

// localServer is the running local server, for the metrics.
var localServer atomic.Pointer[local.Server]

// startLocal serves the local socket when --local_socket is set; the
// func returned stops it.
func startLocal(c *store.Client, o localOptions, log *slog.Logger) (func(), error) {
	if o.socket == "" {
		return func() {}, nil
	}
	lo, err := o.localOpts(log)
	if err != nil {
		return nil, err
	}
	s, err := local.Serve(c, o.socket, lo)
	if err != nil {
		return nil, err
	}
	localServer.Store(s)
	return func() {
		localServer.Store(nil)
		s.Close()
	}, nil
}

// localCollector exports the local server's counters.
type localCollector struct{ descs map[string]*prometheus.Desc }

func newLocalCollector() *localCollector {
	d := map[string]*prometheus.Desc{}
	for n, h := range map[string]string{
		"crescent_local_dummies":                 "Dummy clients registered now.",
		"crescent_local_refused_total":           "Dummy registrations refused (uid, version).",
		"crescent_local_bad_tokens_total":        "Requests with a wrong token (connection closed).",
		"crescent_local_expired_total":           "Dummies dropped after falling silent.",
		"crescent_hot_cache_hits_total":          "Hot cache hits.",
		"crescent_hot_cache_misses_total":        "Hot cache misses.",
		"crescent_hot_cache_admissions_total":    "Values admitted to the hot cache.",
		"crescent_hot_cache_evictions_total":     "Values evicted from the hot cache for room.",
		"crescent_hot_cache_invalidations_total": "Values withdrawn by a write or remove.",
		"crescent_hot_cache_stale_misses_total":  "Lookups that served nothing cached: the invalidation subscription was not fresh.",
		"crescent_hot_cache_resets_total":        "Whole-cache drops (new invalidation subscription, gap, overflow on the master).",
		"crescent_hot_cache_subscription_fresh":  "1 while the invalidation subscription is fresh (hits may be served).",
		"crescent_hot_cache_hit_bytes_total":     "Bytes served from the hot cache.",
		"crescent_hot_cache_bytes":               "Bytes of values in the hot cache.",
		"crescent_hot_cache_capacity_bytes":      "Hot cache size.",
		"crescent_hot_cache_references":          "Hot cache block references held now (dummies' views, reads in progress).",
		"crescent_hot_cache_share_copies_total":  "GetBuffer answers sent as copies: the dummy already held views of its share of the cache blocks.",
		"crescent_local_request_latency_seconds": "Latency of requests from dummies, served.",
	} {
		d[n] = prometheus.NewDesc(n, h, nil, nil)
	}
	return &localCollector{descs: d}
}

func (l *localCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range l.descs {
		ch <- d
	}
}

func (l *localCollector) Collect(ch chan<- prometheus.Metric) {
	s := localServer.Load()
	if s == nil {
		return
	}
	st := s.Stats()
	c := func(n string, v uint64) {
		ch <- prometheus.MustNewConstMetric(l.descs[n], prometheus.CounterValue, float64(v))
	}
	g := func(n string, v int64) {
		ch <- prometheus.MustNewConstMetric(l.descs[n], prometheus.GaugeValue, float64(v))
	}
	g("crescent_local_dummies", st.Dummies)
	c("crescent_local_refused_total", st.Refused)
	c("crescent_local_bad_tokens_total", st.BadTokens)
	c("crescent_local_expired_total", st.Expired)
	c("crescent_hot_cache_hits_total", st.Hits)
	c("crescent_hot_cache_misses_total", st.Misses)
	c("crescent_hot_cache_admissions_total", st.Admissions)
	c("crescent_hot_cache_evictions_total", st.Evictions)
	c("crescent_hot_cache_invalidations_total", st.Invalidations)
	c("crescent_hot_cache_hit_bytes_total", st.HitBytes)
	c("crescent_hot_cache_stale_misses_total", st.StaleMisses)
	c("crescent_hot_cache_resets_total", st.Resets)
	c("crescent_hot_cache_share_copies_total", st.ShareCopies)
	fresh := int64(0)
	if st.Fresh {
		fresh = 1
	}
	g("crescent_hot_cache_subscription_fresh", fresh)
	g("crescent_hot_cache_bytes", st.CacheBytes)
	g("crescent_hot_cache_capacity_bytes", st.CacheCapacity)
	g("crescent_hot_cache_references", st.References)
	buckets := map[float64]uint64{}
	var cum uint64
	for i, n := range st.Latency {
		cum += n
		buckets[(time.Duration(1<<i) * time.Microsecond).Seconds()] = cum
	}
	ch <- prometheus.MustNewConstHistogram(l.descs["crescent_local_request_latency_seconds"], st.LatencyCount, st.LatencySum.Seconds(), buckets)
}

// localSummary is the local server's part of /metrics/summary.
func localSummary() string {
	s := localServer.Load()
	if s == nil {
		return ""
	}
	st := s.Stats()
	var b strings.Builder
	fmt.Fprintf(&b, "Local dummies: %d (refused %d, bad tokens %d, expired %d)\n", st.Dummies, st.Refused, st.BadTokens, st.Expired)
	fmt.Fprintf(&b, "Hot cache: %s of %s, %d references held; hits %d, misses %d, admissions %d, evictions %d, invalidations %d, hit bytes %s\n",
		bytesStr(float64(st.CacheBytes)), bytesStr(float64(st.CacheCapacity)), st.References, st.Hits, st.Misses, st.Admissions, st.Evictions,
		st.Invalidations, bytesStr(float64(st.HitBytes)))
	if st.LatencyCount > 0 {
		fmt.Fprintf(&b, "Local requests: count=%d, mean=%v, p50<%v, p99<%v\n", st.LatencyCount,
			(st.LatencySum / time.Duration(st.LatencyCount)).Round(time.Microsecond), st.Quantile(0.5), st.Quantile(0.99))
	}
	return b.String()
}
