package ha

import "github.com/prometheus/client_golang/prometheus"

var (
	descApplied = prometheus.NewDesc("crescent_ha_follower_applied_seq",
		"Last log seq applied to the follower's replica.", nil, nil)
	descLast = prometheus.NewDesc("crescent_ha_follower_log_last_seq",
		"Last durable log seq, as the follower last read it.", nil, nil)
	descLag = prometheus.NewDesc("crescent_ha_follower_lag_entries",
		"Entries durable in the log and not yet applied to the replica.", nil, nil)
	descEntries = prometheus.NewDesc("crescent_ha_follower_applied_entries_total",
		"Entries applied to the replica by this follower.", nil, nil)
	descApplyErrs = prometheus.NewDesc("crescent_ha_follower_apply_errors_total",
		"Failures that stopped the follower (gap, regression, checksum, term, divergence, compacted log).", nil, nil)
	descReadErrs = prometheus.NewDesc("crescent_ha_follower_read_errors_total",
		"Failed reads of the log, retried.", nil, nil)
	descPending = prometheus.NewDesc("crescent_ha_follower_pending_entries",
		"Entries buffered ahead of a missing seq.", nil, nil)
	descRearms = prometheus.NewDesc("crescent_ha_follower_watch_rearms_total",
		"etcd watches on the log re-established after an error, a compaction or a broken stream.", nil, nil)
)

// FollowerStats are the follower's counters, as its metrics show them.
type FollowerStats struct {
	Applied, LastSeq, Lag uint64
	Entries               uint64 // applied by this follower
	ApplyErrors           uint64 // 0 or 1: the failure that stopped it
	ReadErrors            uint64
	Pending               int
	WatchRearms           uint64
}

// Stats reports the counters.
func (f *Follower) Stats() FollowerStats {
	f.mu.Lock()
	last, err := f.lastSeen, f.err
	f.mu.Unlock()
	a := f.ap
	a.mu.Lock()
	s := FollowerStats{Applied: a.applied, Entries: a.nApplied, Pending: len(a.pending)}
	a.mu.Unlock()
	s.LastSeq = max(last, s.Applied)
	s.Lag = s.LastSeq - s.Applied
	if err != nil && err != ErrClosed && err != ErrHandedOver {
		s.ApplyErrors = 1
	}
	s.ReadErrors = f.readErrs.Load()
	if r, ok := f.n.(interface{ Rearms() uint64 }); ok {
		s.WatchRearms = r.Rearms()
	}
	return s
}

// Collector is the follower's metrics (crescent_ha_follower_*), for the
// caller to register.
func (f *Follower) Collector() prometheus.Collector { return collector{f} }

// Register registers Collector with reg.
func (f *Follower) Register(reg prometheus.Registerer) error { return reg.Register(f.Collector()) }

type collector struct{ f *Follower }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descApplied, descLast, descLag, descEntries, descApplyErrs,
		descReadErrs, descPending, descRearms} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.f.Stats()
	m := func(d *prometheus.Desc, t prometheus.ValueType, v float64) {
		ch <- prometheus.MustNewConstMetric(d, t, v)
	}
	m(descApplied, prometheus.GaugeValue, float64(s.Applied))
	m(descLast, prometheus.GaugeValue, float64(s.LastSeq))
	m(descLag, prometheus.GaugeValue, float64(s.Lag))
	m(descEntries, prometheus.CounterValue, float64(s.Entries))
	m(descApplyErrs, prometheus.CounterValue, float64(s.ApplyErrors))
	m(descReadErrs, prometheus.CounterValue, float64(s.ReadErrors))
	m(descPending, prometheus.GaugeValue, float64(s.Pending))
	m(descRearms, prometheus.CounterValue, float64(s.WatchRearms))
}
