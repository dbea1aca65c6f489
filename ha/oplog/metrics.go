package oplog

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports a durable master's log on /metrics, names
// crescent_oplog_*:
//
//	appended_seq, durable_seq        gauges: last seq numbered, made durable
//	failed                           gauge: 1 once the log failed (fail-stop)
//	errors_total                     counter: failed group commits
//	commit_entries                   histogram: entries per group commit
//	entries_total, bytes_written_total  counters: entries and record bytes made durable
//	fsync_seconds                    histogram: fdatasync of the local log
//	etcd_txn_seconds                 histogram: append transactions to etcd (each attempt)
//	etcd_txns_total                  counter: those transactions, retries included
type Collector struct {
	d *Durable

	appended, durable, failed, errors, commits, entries, bytes, fsync, txn, txns *prometheus.Desc
}

// NewCollector returns the collector of d's log.
func NewCollector(d *Durable) *Collector {
	n := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("crescent_oplog_"+name, help, nil, nil)
	}
	return &Collector{d: d,
		appended: n("appended_seq", "Last sequence id given to an op."),
		durable:  n("durable_seq", "Last sequence id made durable."),
		failed:   n("failed", "1 once the log failed: the master acknowledges nothing more (fail-stop)."),
		errors:   n("errors_total", "Group commits that failed."),
		commits:  n("commit_entries", "Entries per group commit (one fdatasync or etcd transaction)."),
		entries:  n("entries_total", "Entries made durable."),
		bytes:    n("bytes_written_total", "Bytes made durable (local records, etcd batch records)."),
		fsync:    n("fsync_seconds", "fdatasync of the local log."),
		txn:      n("etcd_txn_seconds", "Append transactions to etcd, each attempt."),
		txns:     n("etcd_txns_total", "Append transactions to etcd, retries included."),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.appended, c.durable, c.failed, c.errors, c.commits, c.entries, c.bytes, c.fsync, c.txn, c.txns} {
		ch <- d
	}
}

// localStats and etcdStats are what Local and Etcd (or a wrapper
// embedding them) report.
type localStats interface{ Stats() LocalStats }
type etcdStats interface{ Stats() EtcdStats }

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.d.Sink.Stats()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(c.appended, float64(s.Appended))
	gauge(c.durable, float64(s.Durable))
	failed := 0.0
	if c.d.Failed() != nil {
		failed = 1
	}
	gauge(c.failed, failed)
	counter(c.errors, s.Errors)
	cb := make(map[float64]uint64, len(BatchBounds))
	var cum uint64
	for i, b := range BatchBounds {
		cum += s.BatchBuckets[i]
		cb[float64(b)] = cum
	}
	ch <- prometheus.MustNewConstHistogram(c.commits, s.Batches, float64(s.BatchEntries), cb)
	switch st := c.d.Store.(type) {
	case localStats:
		ls := st.Stats()
		counter(c.entries, ls.Entries)
		counter(c.bytes, ls.Bytes)
		ch <- prometheus.MustNewConstHistogram(c.fsync, ls.Fsyncs, float64(ls.FsyncNanos)/1e9, seconds(ls.FsyncBuckets[:]))
	case etcdStats:
		es := st.Stats()
		counter(c.entries, es.Entries)
		counter(c.bytes, es.Bytes)
		counter(c.txns, es.Txns)
		var n uint64
		for _, k := range es.TxnBuckets {
			n += k
		}
		ch <- prometheus.MustNewConstHistogram(c.txn, n, float64(es.TxnNanos)/1e9, seconds(es.TxnBuckets[:]))
	}
}

// seconds turns per-bucket counts over FsyncBounds into Prometheus's
// cumulative buckets.
func seconds(counts []uint64) map[float64]uint64 {
	out := make(map[float64]uint64, len(FsyncBounds))
	var cum uint64
	for i, b := range FsyncBounds {
		cum += counts[i]
		out[b.Seconds()] = cum
	}
	return out
}
