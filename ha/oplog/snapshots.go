package oplog

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/ha/snapshot"
	"github.com/crescent-kv/crescent/store/master"
)

// Snapshot defaults.
const (
	DefaultSnapshotRetain = 3
	DefaultLogRetain      = 100000
)

// ErrSnapshotBusy is TryTake's answer while another snapshot is taken.
var ErrSnapshotBusy = errors.New("oplog: a snapshot is already being taken")

// DurableOption configures OpenDurable and Open.
type DurableOption func(*durableOptions)

type durableOptions struct {
	payloads snapshot.Payloads
	catalog  snapshot.Catalog
}

// WithSnapshots makes recovery start from the latest snapshot in catalog
// (its body read from payloads) and replay the log from its Seq+1. No
// snapshot published (snapshot.ErrNoSnapshot) means replay from seq 1; any
// other catalog or payload error fails the open, so an unreachable
// catalog never yields an empty master. The Durable does not own them.
func WithSnapshots(p snapshot.Payloads, c snapshot.Catalog) DurableOption {
	return func(o *durableOptions) { o.payloads, o.catalog = p, c }
}

// latestSnapshot is the catalog's latest, ok false when none was ever
// published.
func latestSnapshot(ctx context.Context, c snapshot.Catalog) (snapshot.Meta, bool, error) {
	meta, err := c.Latest(ctx)
	switch {
	case errors.Is(err, snapshot.ErrNoSnapshot):
		return snapshot.Meta{}, false, nil
	case err != nil:
		return snapshot.Meta{}, false, fmt.Errorf("snapshot catalog: %w", err)
	}
	return meta, true, nil
}

// loadSnapshot imports snapshot meta into the fresh master m.
func loadSnapshot(ctx context.Context, p snapshot.Payloads, meta snapshot.Meta, m *master.Master) error {
	rc, err := p.Open(ctx, meta.ID)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", meta.ID, err)
	}
	defer rc.Close()
	d, err := snapshot.NewDecoder(rc)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", meta.ID, err)
	}
	if h := d.Header(); h.Seq != meta.Seq {
		return fmt.Errorf("snapshot %s: body at seq %d, catalog says %d", meta.ID, h.Seq, meta.Seq)
	}
	if err := m.Import(d.Next); err != nil {
		return fmt.Errorf("snapshot %s: %w", meta.ID, err)
	}
	return nil
}

// LoadLatest builds a master from cfg (not started) holding the latest
// published snapshot, for a standby to follow the log from meta.Seq+1
// (ha.Follower). With nothing published it is empty and meta is zero;
// any other catalog or payload error fails.
func LoadLatest(ctx context.Context, p snapshot.Payloads, c snapshot.Catalog, cfg master.Config) (*master.Master, snapshot.Meta, error) {
	meta, ok, err := latestSnapshot(ctx, c)
	if err != nil {
		return nil, meta, err
	}
	m, err := master.New(cfg)
	if err != nil {
		return nil, meta, err
	}
	if ok {
		if err := loadSnapshot(ctx, p, meta, m); err != nil {
			m.Close()
			return nil, meta, err
		}
	}
	return m, meta, nil
}

// replayLog applies entries from..to (inclusive) of st to m and returns
// the highest term seen and how many were applied.
func replayLog(ctx context.Context, st Store, m *master.Master, from, to uint64) (term, n uint64, err error) {
	for next := from; next <= to; {
		es, err := st.Read(ctx, next, int(min(uint64(replayBatch), to-next+1)))
		if err != nil {
			return term, n, fmt.Errorf("read seq %d: %w", next, err)
		}
		if len(es) == 0 {
			return term, n, fmt.Errorf("seq %d missing (last %d)", next, to)
		}
		for i := range es {
			e := &es[i]
			if e.Seq != next {
				return term, n, fmt.Errorf("seq %d where %d was expected", e.Seq, next)
			}
			op, err := DecodeOp(e)
			if err != nil {
				return term, n, fmt.Errorf("seq %d: %w", e.Seq, err)
			}
			if err := m.Replay(op); err != nil {
				return term, n, fmt.Errorf("replay seq %d (%v %q): %w", e.Seq, op.Kind, op.Key, err)
			}
			term = max(term, e.Term)
			next++
			n++
		}
	}
	return term, n, nil
}

// SnapshotConfig configures a Snapshotter.
type SnapshotConfig struct {
	Payloads snapshot.Payloads
	Catalog  snapshot.Catalog
	// Master configures the scratch masters snapshots are built in (its
	// OpLog, Events and Logger are not used).
	Master    master.Config
	ClusterID string
	// Retain is how many snapshots are kept (default 3); LogRetain how
	// many log entries below the latest snapshot's seq compaction keeps
	// for lagging followers (default 100000; negative keeps none).
	Retain    int
	LogRetain int64
	// Clock for Created (default time.Now).
	Now func() time.Time
}

// SnapshotResult describes one Take.
type SnapshotResult struct {
	Meta snapshot.Meta
	// Unchanged: the log had nothing past the latest snapshot, which is
	// Meta (zero for an empty log); nothing was written.
	Unchanged bool
	Records   int
	Replayed  uint64 // log entries applied on top of the previous snapshot
	Took      time.Duration
	// LongestPause is the longest the serving master was paused: 0, it
	// is never touched. ScratchLongestHold is the longest the scratch
	// export held one lock (master.ExportStats.LongestHold), and
	// ScratchLongestShardHold one shard's: what a hot standby exporting
	// its replica would make its control plane and its keys wait.
	LongestPause            time.Duration
	ScratchLongestHold      time.Duration
	ScratchLongestShardHold time.Duration
	// FirstSeq is the log's first seq after compaction; Pruned the ids
	// of the snapshots deleted beyond retention (and of orphan bodies).
	FirstSeq uint64
	Pruned   []string
}

// Snapshotter takes snapshots of the state a log describes without
// touching the master that serves it: it loads the latest snapshot into a
// scratch master, replays the log past it up to the durable LastSeq,
// exports the scratch master (the state at exactly that seq), publishes
// the body, compacts the log behind it and prunes old snapshots. One
// snapshot is taken at a time.
type Snapshotter struct {
	st  Store
	cfg SnapshotConfig
	mu  sync.Mutex
	// fail, in tests, injects a failure after a step: "payload",
	// "publish", "compact".
	fail func(step string) error
}

// NewSnapshotter returns a Snapshotter over st.
func NewSnapshotter(st Store, cfg SnapshotConfig) (*Snapshotter, error) {
	if cfg.Payloads == nil || cfg.Catalog == nil {
		return nil, errors.New("oplog: snapshotter needs payloads and a catalog")
	}
	if cfg.Retain == 0 {
		cfg.Retain = DefaultSnapshotRetain
	}
	if cfg.Retain < 1 {
		return nil, fmt.Errorf("oplog: snapshot retain %d, want at least 1", cfg.Retain)
	}
	if cfg.LogRetain == 0 {
		cfg.LogRetain = DefaultLogRetain
	}
	cfg.LogRetain = max(cfg.LogRetain, 0)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Master.OpLog, cfg.Master.Events = nil, nil
	return &Snapshotter{st: st, cfg: cfg}, nil
}

// TryTake is Take, or ErrSnapshotBusy at once while another runs.
func (s *Snapshotter) TryTake(ctx context.Context) (SnapshotResult, error) {
	if !s.mu.TryLock() {
		return SnapshotResult{}, ErrSnapshotBusy
	}
	defer s.mu.Unlock()
	return s.take(ctx)
}

// Take takes a snapshot at the log's durable LastSeq, waiting for one
// already running.
func (s *Snapshotter) Take(ctx context.Context) (SnapshotResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.take(ctx)
}

func (s *Snapshotter) step(name string) error {
	if s.fail != nil {
		return s.fail(name)
	}
	return nil
}

func (s *Snapshotter) take(ctx context.Context) (SnapshotResult, error) {
	start := time.Now()
	var res SnapshotResult
	last, err := s.st.LastSeq(ctx)
	if err != nil {
		return res, err
	}
	base, ok, err := latestSnapshot(ctx, s.cfg.Catalog)
	if err != nil {
		return res, err
	}
	if last == 0 || ok && base.Seq >= last { // nothing (new) to cover
		res.Meta, res.Unchanged, res.Took = base, true, time.Since(start)
		return res, nil
	}
	m, err := master.New(s.cfg.Master)
	if err != nil {
		return res, err
	}
	defer m.Close()
	from, term := uint64(1), uint64(0)
	if ok {
		if err := loadSnapshot(ctx, s.cfg.Payloads, base, m); err != nil {
			return res, err
		}
		from, term = base.Seq+1, base.Term
	}
	t, n, err := replayLog(ctx, s.st, m, from, last)
	if err != nil {
		return res, fmt.Errorf("oplog: snapshot: %w", err)
	}
	res.Replayed, term = n, max(term, t)
	var st master.ExportStats
	if res.Meta, st, err = s.write(ctx, m, last, term); err != nil {
		return res, err
	}
	res.Records, res.ScratchLongestHold, res.ScratchLongestShardHold = st.Records, st.LongestHold, st.LongestShardHold
	if err := s.step("payload"); err != nil {
		return res, err
	}
	if err := s.cfg.Catalog.Publish(ctx, res.Meta); err != nil {
		return res, fmt.Errorf("oplog: snapshot: publish %s: %w", res.Meta.ID, err)
	}
	if err := s.step("publish"); err != nil {
		return res, err
	}
	// The snapshot covers [1, Seq]; keep LogRetain entries below it.
	if before := res.Meta.Seq + 1 - min(uint64(s.cfg.LogRetain), res.Meta.Seq); before > 1 {
		if err := s.st.Compact(ctx, before); err != nil {
			return res, fmt.Errorf("oplog: snapshot: compact below %d: %w", before, err)
		}
	}
	if res.FirstSeq, err = s.st.FirstSeq(ctx); err != nil {
		return res, err
	}
	if err := s.step("compact"); err != nil {
		return res, err
	}
	if res.Pruned, err = snapshot.Prune(ctx, s.cfg.Catalog, s.cfg.Payloads, s.cfg.Retain); err != nil {
		return res, fmt.Errorf("oplog: snapshot: %w", err)
	}
	// Bodies an earlier crash orphaned (between Commit and Publish, or
	// inside Prune); no other snapshot is being written now.
	if lp, ok := s.cfg.Payloads.(snapshot.ListablePayloads); ok {
		gone, err := snapshot.CleanOrphans(ctx, s.cfg.Catalog, lp)
		res.Pruned = append(res.Pruned, gone...)
		if err != nil {
			return res, fmt.Errorf("oplog: snapshot: %w", err)
		}
	}
	res.Took = time.Since(start)
	return res, nil
}

// countingWriter computes a body's size and CRC32C on its way out.
type countingWriter struct {
	w   io.Writer
	n   int64
	crc hash.Hash32
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.crc.Write(b[:n])
	return n, err
}

// write exports m as the snapshot at seq and commits its body.
func (s *Snapshotter) write(ctx context.Context, m *master.Master, seq, term uint64) (snapshot.Meta, master.ExportStats, error) {
	meta := snapshot.Meta{ID: snapshot.IDFor(seq, term), Seq: seq, Term: term, Created: s.cfg.Now()}
	n := uint64(m.ExportCount())
	// An uncommitted body of this id (a crash before its publish) is
	// not in the catalog: ids above the latest are never published.
	if err := s.cfg.Payloads.Delete(ctx, meta.ID); err != nil {
		return meta, master.ExportStats{}, fmt.Errorf("oplog: snapshot: clear %s: %w", meta.ID, err)
	}
	pw, err := s.cfg.Payloads.Create(ctx, meta.ID)
	if err != nil {
		return meta, master.ExportStats{}, fmt.Errorf("oplog: snapshot: create %s: %w", meta.ID, err)
	}
	cw := &countingWriter{w: pw, crc: crc32.New(crc32.MakeTable(crc32.Castagnoli))}
	st, err := func() (master.ExportStats, error) {
		enc, err := snapshot.NewEncoder(cw, snapshot.Header{ClusterID: s.cfg.ClusterID, Seq: seq, Term: term,
			Created: meta.Created, Records: n})
		if err != nil {
			return master.ExportStats{}, err
		}
		st, err := m.Export(enc.Write)
		if err != nil {
			return st, err
		}
		return st, enc.Close()
	}()
	if err == nil {
		err = pw.Commit()
	}
	if err != nil {
		return meta, st, errors.Join(fmt.Errorf("oplog: snapshot: write %s: %w", meta.ID, err), pw.Abort())
	}
	meta.Size, meta.Checksum = cw.n, cw.crc.Sum32()
	return meta, st, nil
}
