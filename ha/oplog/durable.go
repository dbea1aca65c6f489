package oplog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/crescent-kv/crescent/ha/snapshot"
	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// replayBatch is how many entries recovery reads at a time.
const replayBatch = 1024

// Durable is a master made durable by an operation log (a local data
// directory or etcd): the store, the master rebuilt from it and the sink
// logging the master's changes.
type Durable struct {
	Master *master.Master
	Sink   *Sink
	Store  Store
	// Snapshot is the snapshot recovery started from (zero ID: none),
	// Replayed how many entries it applied after it, Took how long
	// opening the directory, loading the snapshot and replaying took.
	Snapshot snapshot.Meta
	Replayed uint64
	Took     time.Duration
}

// OpenDurable opens (or creates) the data directory dir, builds a master
// from cfg with the log as its OpLog, loads the latest snapshot into it
// when WithSnapshots gives a source, replays every entry after it and
// returns it, not started. Any error (an entry that does not decode, a
// replay that diverges, a log compacted with no snapshot to start from)
// fails the whole open: a master never serves a partial state. cfg.OpLog
// must be nil.
//
// Config.OpLog is taken at construction, so the master gets a
// forwarder to the sink, which is created after the replay and numbers
// from the store's last seq; Replay never logs, so the replayed entries
// are not appended again.
func OpenDurable(ctx context.Context, dir string, cfg master.Config, opts LocalOptions, more ...DurableOption) (*Durable, error) {
	if cfg.OpLog != nil {
		return nil, errors.New("oplog: OpenDurable: cfg.OpLog is set")
	}
	start := time.Now()
	st, err := OpenLocal(dir, opts)
	if err != nil {
		return nil, err
	}
	d, err := open(ctx, st, cfg, start, more)
	if err != nil {
		return nil, fmt.Errorf("oplog: recover %s: %w", dir, err)
	}
	return d, nil
}

// Open is OpenDurable over any Store (etcd, say), which the Durable then
// owns: Close closes it, also when Open fails.
func Open(ctx context.Context, st Store, cfg master.Config, more ...DurableOption) (*Durable, error) {
	d, err := open(ctx, st, cfg, time.Now(), more)
	if err != nil {
		return nil, fmt.Errorf("oplog: recover: %w", err)
	}
	return d, nil
}

func open(ctx context.Context, st Store, cfg master.Config, start time.Time, more []DurableOption) (*Durable, error) {
	if cfg.OpLog != nil {
		st.Close()
		return nil, errors.New("cfg.OpLog is set")
	}
	var o durableOptions
	for _, f := range more {
		f(&o)
	}
	d := &Durable{Store: st}
	if err := d.open(ctx, cfg, o); err != nil {
		d.Close()
		return nil, err
	}
	d.Took = time.Since(start)
	return d, nil
}

// termed and failing are what Local and Etcd add to Store.
type termed interface{ Term() uint64 }
type failing interface{ Err() error }

func (d *Durable) open(ctx context.Context, cfg master.Config, o durableOptions) error {
	st := d.Store
	var snap snapshot.Meta
	if o.catalog != nil {
		meta, ok, err := latestSnapshot(ctx, o.catalog)
		if err != nil {
			return err
		}
		if ok {
			snap = meta
		}
	}
	first, err := st.FirstSeq(ctx)
	if err != nil {
		return err
	}
	last, err := st.LastSeq(ctx)
	if err != nil {
		return err
	}
	switch {
	case last > snap.Seq && first > snap.Seq+1 && snap.ID == "":
		return fmt.Errorf("log starts at seq %d and no snapshot covers the seqs before it", first)
	case last > snap.Seq && first > snap.Seq+1:
		return fmt.Errorf("log starts at seq %d, after snapshot %s (seq %d): seqs %d..%d are lost", first, snap.ID, snap.Seq, snap.Seq+1, first-1)
	case last < snap.Seq:
		return fmt.Errorf("log ends at seq %d, before snapshot %s (seq %d)", last, snap.ID, snap.Seq)
	}
	lazy := &lazySink{}
	cfg.OpLog = lazy
	m, err := master.New(cfg)
	if err != nil {
		return err
	}
	d.Master = m
	term := uint64(1)
	if t, ok := st.(termed); ok {
		term = max(term, t.Term())
	}
	if snap.ID != "" {
		if err := loadSnapshot(ctx, o.payloads, snap, m); err != nil {
			return err
		}
		d.Snapshot = snap
		term = max(term, snap.Term)
	}
	t, n, err := replayLog(ctx, st, m, snap.Seq+1, last)
	d.Replayed = n
	if err != nil {
		return err
	}
	term = max(term, t)
	sink, err := NewSink(ctx, st, SinkConfig{Term: term})
	if err != nil {
		return err
	}
	d.Sink = sink
	lazy.s = sink
	return nil
}

// lazySink lets the master be built before the sink exists; it is set
// before the master is started or handed out, and replay never appends.
type lazySink struct{ s *Sink }

func (l *lazySink) Append(op *master.Op) {
	if l.s == nil {
		panic("oplog: an op was logged during recovery")
	}
	l.s.Append(op)
}

// Wait returns once everything the master logged so far is durable, at
// once when nothing is pending; after a failure of the log it returns
// the failure, so nothing more is acknowledged (fail-stop).
func (d *Durable) Wait(ctx context.Context) error {
	if err := d.Sink.Failed(); err != nil {
		return err
	}
	seq := d.Sink.Appended()
	if d.Sink.Durable() >= seq {
		return nil
	}
	crpc.Detach(ctx) // a call on its connection's reader lets the others go on
	return d.Sink.WaitDurable(ctx, seq)
}

// WaitSeq returns once seq is durable (at once when it is), or the log's
// failure, or ctx's error.
func (d *Durable) WaitSeq(ctx context.Context, seq uint64) error {
	if err := d.Sink.Failed(); err != nil {
		return err
	}
	if d.Sink.Durable() >= seq {
		return nil
	}
	crpc.Detach(ctx)
	return d.Sink.WaitDurable(ctx, seq)
}

// Failed is the log's failure, nil while healthy.
func (d *Durable) Failed() error {
	if err := d.Sink.Failed(); err != nil {
		return err
	}
	if f, ok := d.Store.(failing); ok {
		return f.Err()
	}
	return nil
}

// ServiceOption makes a service.Service answer every RPC only once the
// changes it may have seen are durable, and report the log's failure
// on /health. Reads of keys wait only for the last changes of their keys
// (Sink.LastChange), not for everything logged so far.
func (d *Durable) ServiceOption() service.Option {
	dur := service.WithDurability(d.Wait, d.Failed)
	reads := service.WithReadDurability(d.Sink.LastChange, d.WaitSeq)
	return func(s *service.Service) {
		dur(s)
		reads(s)
	}
}

// Close closes the master, then the sink (writing what is queued), then
// the store; it returns the first error.
func (d *Durable) Close() error {
	var errs []error
	if d.Master != nil {
		errs = append(errs, d.Master.Close())
	}
	if d.Sink != nil {
		errs = append(errs, d.Sink.Close())
	}
	errs = append(errs, d.Store.Close())
	return errors.Join(errs...)
}
