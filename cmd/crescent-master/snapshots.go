package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/metadata/redismeta"
	"github.com/crescent-kv/crescent/ha/snapshot"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/admin"
)

// localSnapshots opens the local payload store and catalog, sharing dir.
func localSnapshots(dir string) (snapshot.Payloads, snapshot.Catalog, error) {
	p, err := snapshot.NewLocalPayloads(dir)
	if err != nil {
		return nil, nil, err
	}
	c, err := snapshot.NewLocalCatalog(dir)
	if err != nil {
		return nil, nil, err
	}
	return p, c, nil
}

func (c *config) snapshotFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.SnapshotInterval, "snapshot_interval", c.SnapshotInterval, "with --data_dir, take a snapshot this often (0: only on POST /snapshot)")
	fs.IntVar(&c.SnapshotRetain, "snapshot_retain", c.SnapshotRetain, "snapshots kept (older ones are deleted)")
	fs.StringVar(&c.SnapshotDir, "snapshot_dir", c.SnapshotDir, "directory of the snapshots (default DATA_DIR/snapshots)")
	fs.IntVar(&c.OplogSyncers, "oplog_syncers", c.OplogSyncers, "with --data_dir, group commits that may be in their fdatasync at once (1: one after the other; more may help on disks that flush in parallel)")
	fs.Int64Var(&c.OplogRetain, "oplog_retain", c.OplogRetain, "log entries kept below the latest snapshot for lagging followers; older ones are compacted away")
	fs.StringVar(&c.SnapshotCatalog, "snapshot_catalog", c.SnapshotCatalog, "redis://[user:pass@]host:port[/db]: keep the snapshot catalog in Redis (under cluster_id), for masters that share no disk; the bodies stay in snapshot_dir, which every master must then be able to read (empty: a catalog in snapshot_dir)")
}

func (c *config) validateSnapshots() error {
	switch {
	case c.SnapshotInterval < 0:
		return fmt.Errorf("snapshot_interval %v is negative", c.SnapshotInterval)
	case c.SnapshotRetain < 1:
		return fmt.Errorf("snapshot_retain %d, want at least 1", c.SnapshotRetain)
	case c.OplogSyncers < 1 || c.OplogSyncers > oplog.MaxSyncers:
		return fmt.Errorf("oplog_syncers %d outside [1, %d]", c.OplogSyncers, oplog.MaxSyncers)
	case c.OplogRetain < 0:
		return fmt.Errorf("oplog_retain %d is negative", c.OplogRetain)
	case c.SnapshotDir != "" && c.DataDir == "" && c.Oplog == "":
		return errors.New("snapshot_dir needs data_dir or oplog")
	case c.SnapshotCatalog != "" && c.SnapshotDir == "" && c.DataDir == "":
		return errors.New("snapshot_catalog needs snapshot_dir (or data_dir) for the snapshot bodies")
	case c.SnapshotCatalog != "" && !strings.HasPrefix(c.SnapshotCatalog, "redis://") && !strings.HasPrefix(c.SnapshotCatalog, "rediss://"):
		return fmt.Errorf("snapshot_catalog %q: want redis://host:port[/db] or rediss://", metadata.Redact(c.SnapshotCatalog))
	}
	return nil
}

// snapshots is a durable master's snapshot source and taker.
type snapshots struct {
	log      *slog.Logger
	payloads snapshot.Payloads
	catalog  snapshot.Catalog
	sn       *oplog.Snapshotter
	redis    *redis.Client // the Redis catalog's client, closed with it
	metrics  snapshotMetrics
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func openSnapshots(cfg config, log *slog.Logger) (*snapshots, error) {
	s := &snapshots{log: log, metrics: newSnapshotMetrics()}
	dir := cfg.SnapshotDir
	if dir == "" {
		dir = filepath.Join(cfg.DataDir, "snapshots")
	}
	if cfg.SnapshotCatalog == "" {
		p, c, err := localSnapshots(dir)
		if err != nil {
			return nil, fmt.Errorf("snapshots in %s: %w", dir, err)
		}
		s.payloads, s.catalog = p, c
		return s, nil
	}
	p, err := snapshot.NewLocalPayloads(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshots in %s: %w", dir, err)
	}
	opts, err := redismeta.ParseConn(cfg.SnapshotCatalog)
	if err != nil {
		return nil, fmt.Errorf("snapshot_catalog: %w", err)
	}
	s.redis = redis.NewClient(opts)
	s.payloads, s.catalog = p, snapshot.NewRedisCatalog(s.redis, "crescent:", cfg.ClusterID)
	log.Info("snapshot catalog in Redis", "addr", opts.Addr, "keys", "crescent:{"+cfg.ClusterID+"}:*")
	return s, nil
}

// recovery is the open option that starts from the latest snapshot.
func (s *snapshots) recovery() []oplog.DurableOption {
	if s.catalog == nil {
		return nil
	}
	return []oplog.DurableOption{oplog.WithSnapshots(s.payloads, s.catalog)}
}

// start takes a snapshot every interval and returns the admin option
// serving POST /snapshot.
func (s *snapshots) start(cfg config, d *oplog.Durable, mc master.Config) ([]admin.Option, error) {
	if s.catalog == nil {
		return nil, nil
	}
	mc.Logger, mc.Events = nil, nil
	logRetain := cfg.OplogRetain
	if logRetain == 0 {
		logRetain = -1 // SnapshotConfig's "keep none"
	}
	sn, err := oplog.NewSnapshotter(d.Store, oplog.SnapshotConfig{Payloads: s.payloads, Catalog: s.catalog, Master: mc,
		Retain: cfg.SnapshotRetain, LogRetain: logRetain})
	if err != nil {
		return nil, err
	}
	s.sn = sn
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if cfg.SnapshotInterval > 0 {
		s.wg.Add(1)
		go s.loop(ctx, cfg.SnapshotInterval)
	}
	take := func(ctx context.Context) (admin.SnapshotInfo, error) {
		res, err := s.take(ctx, sn.TryTake)
		if errors.Is(err, oplog.ErrSnapshotBusy) {
			err = fmt.Errorf("%w: %w", admin.ErrBusy, err)
		}
		if err != nil {
			return admin.SnapshotInfo{}, err
		}
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		return admin.SnapshotInfo{ID: res.Meta.ID, Seq: res.Meta.Seq, Size: res.Meta.Size, TookMs: ms(res.Took),
			LongestPauseMs: ms(res.LongestPause), ScratchLongestHoldMs: ms(res.ScratchLongestHold),
			ScratchLongestShardHoldMs: ms(res.ScratchLongestShardHold), Unchanged: res.Unchanged}, nil
	}
	return []admin.Option{admin.WithSnapshotHook(take)}, nil
}

func (s *snapshots) take(ctx context.Context, f func(context.Context) (oplog.SnapshotResult, error)) (oplog.SnapshotResult, error) {
	res, err := f(ctx)
	switch {
	case errors.Is(err, oplog.ErrSnapshotBusy):
	case err != nil:
		s.metrics.failed.Inc()
		s.log.Error("snapshot failed", "err", err)
	case res.Unchanged:
		s.log.Debug("snapshot: nothing new", "id", res.Meta.ID)
	default:
		s.metrics.observe(res)
		s.log.Info("snapshot taken", "id", res.Meta.ID, "seq", res.Meta.Seq, "size", res.Meta.Size, "records", res.Records,
			"replayed", res.Replayed, "took", res.Took, "longest_pause", res.LongestPause,
			"scratch_longest_hold", res.ScratchLongestHold, "scratch_longest_shard_hold", res.ScratchLongestShardHold, "log_first_seq", res.FirstSeq, "pruned", len(res.Pruned))
	}
	return res, err
}

func (s *snapshots) loop(ctx context.Context, every time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.take(ctx, s.sn.Take)
		}
	}
}

// stop ends the periodic snapshots and waits for one running.
func (s *snapshots) stop() {
	if s.cancel != nil {
		s.cancel()
		s.wg.Wait()
	}
}

func (s *snapshots) close() {
	if s.catalog != nil {
		if err := s.catalog.Close(); err != nil {
			s.log.Warn("closing the snapshot catalog", "err", err)
		}
	}
	if s.redis != nil {
		s.redis.Close()
	}
}

// snapshotMetrics are the snapshots' series on /metrics.
type snapshotMetrics struct {
	taken, failed       prometheus.Counter
	seq, size, logFirst prometheus.Gauge
	took                prometheus.Histogram
}

func newSnapshotMetrics() snapshotMetrics {
	return snapshotMetrics{
		taken:    prometheus.NewCounter(prometheus.CounterOpts{Name: "crescent_snapshot_taken_total", Help: "Snapshots published."}),
		failed:   prometheus.NewCounter(prometheus.CounterOpts{Name: "crescent_snapshot_failed_total", Help: "Snapshots that failed."}),
		seq:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "crescent_snapshot_last_seq", Help: "Last log seq the latest snapshot includes."}),
		size:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "crescent_snapshot_last_size_bytes", Help: "Size of the latest snapshot."}),
		logFirst: prometheus.NewGauge(prometheus.GaugeOpts{Name: "crescent_snapshot_log_first_seq", Help: "First seq the log holds after the latest compaction."}),
		took: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "crescent_snapshot_duration_seconds", Help: "Time to build, write and publish a snapshot.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
	}
}

func (m snapshotMetrics) observe(res oplog.SnapshotResult) {
	m.taken.Inc()
	m.seq.Set(float64(res.Meta.Seq))
	m.size.Set(float64(res.Meta.Size))
	m.logFirst.Set(float64(res.FirstSeq))
	m.took.Observe(res.Took.Seconds())
}

func (m snapshotMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.taken, m.failed, m.seq, m.size, m.logFirst, m.took}
}
