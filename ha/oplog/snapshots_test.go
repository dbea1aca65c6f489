package oplog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/ha/internal/workload"
	"github.com/crescent-kv/crescent/ha/snapshot"
	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/master"
)

// memSnaps is an in-memory payload store and catalog for these tests;
// fail, when set, makes Latest (and List) fail as an unreachable backend.
type memSnaps struct {
	mu     sync.Mutex
	bodies map[string][]byte
	metas  []snapshot.Meta
	fail   error
	// delFail, when set, may fail a payload Delete (a crash between
	// pruning a catalog entry and its body).
	delFail func(id string) error
}

func newMemSnaps() *memSnaps { return &memSnaps{bodies: map[string][]byte{}} }

type memWriter struct {
	s  *memSnaps
	id string
	b  bytes.Buffer
}

func (w *memWriter) Write(p []byte) (int, error) { return w.b.Write(p) }
func (w *memWriter) Abort() error                { return nil }
func (w *memWriter) Commit() error {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.s.bodies[w.id] = bytes.Clone(w.b.Bytes())
	return nil
}

func (s *memSnaps) Create(_ context.Context, id string) (snapshot.PayloadWriter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.bodies[id]; ok {
		return nil, fmt.Errorf("payload %s exists", id)
	}
	return &memWriter{s: s, id: id}, nil
}

func (s *memSnaps) Open(_ context.Context, id string) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.bodies[id]
	if !ok {
		return nil, snapshot.ErrNotFound
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (s *memSnaps) Delete(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.delFail != nil {
		if err := s.delFail(id); err != nil {
			return err
		}
	}
	delete(s.bodies, id)
	return nil
}

func (s *memSnaps) Publish(_ context.Context, m snapshot.Meta) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metas = append(s.metas, m)
	slices.SortFunc(s.metas, func(a, b snapshot.Meta) int { return cmpSeq(a.Seq, b.Seq) })
	return nil
}

func cmpSeq(a, b uint64) int {
	if a < b {
		return -1
	} else if a > b {
		return 1
	}
	return 0
}

func (s *memSnaps) Latest(context.Context) (snapshot.Meta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return snapshot.Meta{}, s.fail
	}
	if len(s.metas) == 0 {
		return snapshot.Meta{}, snapshot.ErrNoSnapshot
	}
	return s.metas[len(s.metas)-1], nil
}

func (s *memSnaps) List(context.Context) ([]snapshot.Meta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	return slices.Clone(s.metas), nil
}

func (s *memSnaps) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, m := range s.metas {
		out = append(out, m.ID)
	}
	return out
}

// catalog is the memSnaps as a snapshot.Catalog (Delete differs).
type memCatalog struct{ *memSnaps }

func (c memCatalog) Delete(_ context.Context, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.metas = slices.DeleteFunc(c.metas, func(m snapshot.Meta) bool { return m.ID == id })
	return nil
}
func (c memCatalog) Close() error { return nil }

var t1 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func snapCfg(clk *clock.Fake) master.Config {
	return master.Config{Shards: 4, Clock: clk, Seed: 1}
}

// TestSnapshotRecovery drives a durable master through a random workload,
// taking snapshots along the way (with compaction keeping few entries and
// small log segments, so compaction removes files); recovery from the
// latest snapshot plus the log tail reproduces the master exactly, at
// every checkpoint.
func TestSnapshotRecovery(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			dir := t.TempDir()
			clk := clock.NewFake(t1)
			snaps := newMemSnaps()
			cat := memCatalog{snaps}
			opts := LocalOptions{SegmentBytes: 16 << 10}
			d, err := OpenDurable(ctx, dir, snapCfg(clk), opts, WithSnapshots(snaps, cat))
			require.NoError(t, err)
			sn, err := NewSnapshotter(d.Store, SnapshotConfig{Payloads: snaps, Catalog: cat, Master: snapCfg(clk),
				ClusterID: "t", Retain: 2, LogRetain: 50})
			require.NoError(t, err)
			taken := 0
			workload.Drive(t, d.Master, clk, 0, seed, 4000, func() {
				require.NoError(t, d.Wait(ctx))
				res, err := sn.Take(ctx)
				require.NoError(t, err)
				if res.Unchanged {
					return
				}
				taken++
				require.Equal(t, d.Sink.Durable(), res.Meta.Seq)
				require.Zero(t, res.LongestPause)
				require.LessOrEqual(t, len(snaps.ids()), 2)
				if res.Meta.Seq > 50 {
					require.LessOrEqual(t, res.FirstSeq, res.Meta.Seq+1-50, "compaction keeps LogRetain entries")
				}
			})
			require.NoError(t, d.Wait(ctx))
			want := dumpMaster(t, d.Master)
			first, err := d.Store.FirstSeq(ctx)
			require.NoError(t, err)
			require.Greater(t, first, uint64(1), "the log was compacted")
			require.NoError(t, d.Close())

			d, err = OpenDurable(ctx, dir, snapCfg(clk), opts, WithSnapshots(snaps, cat))
			require.NoError(t, err)
			require.NotEmpty(t, d.Snapshot.ID)
			require.Equal(t, want, dumpMaster(t, d.Master))
			require.NoError(t, d.Close())
			require.Greater(t, taken, 3)

			// Without the snapshots, the compacted log does not open.
			_, err = OpenDurable(ctx, dir, snapCfg(clk), opts)
			require.ErrorContains(t, err, "no snapshot covers")
		})
	}
}

// TestSnapshotUnderLoad takes snapshots while puts and removes run; once
// the load stops, recovery from the last snapshot plus the tail equals the
// live master.
func TestSnapshotUnderLoad(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	dir := t.TempDir()
	clk := clock.NewFake(t1)
	snaps := newMemSnaps()
	cat := memCatalog{snaps}
	d, err := OpenDurable(ctx, dir, snapCfg(clk), LocalOptions{}, WithSnapshots(snaps, cat))
	require.NoError(t, err)
	m := d.Master
	for i := range 4 {
		c := master.UUID{Hi: 1, Lo: uint64(i)}
		require.NoError(t, m.MountSegment(c, alloc.Segment{ID: master.UUID{Hi: 2, Lo: uint64(i)}, Name: "h",
			Base: uint64(i+1) << 32, Size: 8 << 20, Protocol: "tcp"}))
	}
	sn, err := NewSnapshotter(d.Store, SnapshotConfig{Payloads: snaps, Catalog: cat, Master: snapCfg(clk), LogRetain: 100})
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			c := master.UUID{Hi: 1, Lo: uint64(w)}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("w%d-%d", w, r.IntN(400))
				if _, err := m.PutStart(c, k, uint64(1+r.IntN(8<<10)), master.ReplicateConfig{Replicas: 1 + r.IntN(2)}); err == nil {
					if r.IntN(4) == 0 {
						_ = m.PutRevoke(c, k, master.Memory)
					} else {
						_ = m.PutEnd(c, k, master.Memory, nil)
					}
				} else {
					_ = m.Remove(k, true)
				}
			}
		}()
	}
	var last SnapshotResult
	for i := 0; i < 5 || last.Meta.Seq < 2000; i++ {
		res, err := sn.Take(ctx)
		require.NoError(t, err)
		last = res
		require.Zero(t, res.LongestPause)
	}
	close(stop)
	wg.Wait()
	require.NoError(t, d.Wait(ctx))
	want := dumpMaster(t, m)
	require.Greater(t, d.Sink.Durable(), last.Meta.Seq, "the load went on after the last snapshot")
	require.NoError(t, d.Close())
	d, err = OpenDurable(ctx, dir, snapCfg(clk), LocalOptions{}, WithSnapshots(snaps, cat))
	require.NoError(t, err)
	defer d.Close()
	require.Equal(t, last.Meta.ID, d.Snapshot.ID)
	require.Positive(t, d.Replayed)
	require.Equal(t, want, dumpMaster(t, d.Master))
	t.Logf("last snapshot at seq %d (%d records, scratch longest hold %v), %d entries replayed after it",
		last.Meta.Seq, last.Records, last.ScratchLongestHold, d.Replayed)
}

// TestSnapshotCrashBetweenSteps fails a snapshot after each of its steps
// (body written, published, log compacted, catalog entry pruned): the
// state stays recoverable, and the next snapshot goes through.
func TestSnapshotCrashBetweenSteps(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	for _, step := range []string{"payload", "publish", "compact", "prune-catalog"} {
		t.Run(step, func(t *testing.T) {
			dir := t.TempDir()
			clk := clock.NewFake(t1)
			snaps := newMemSnaps()
			cat := memCatalog{snaps}
			opts := LocalOptions{SegmentBytes: 8 << 10}
			d, err := OpenDurable(ctx, dir, snapCfg(clk), opts, WithSnapshots(snaps, cat))
			require.NoError(t, err)
			sn, err := NewSnapshotter(d.Store, SnapshotConfig{Payloads: snaps, Catalog: cat, Master: snapCfg(clk), Retain: 1, LogRetain: 10})
			require.NoError(t, err)
			n := 0
			boom := errors.New("injected crash")
			workload.Drive(t, d.Master, clk, 0, 5, 3000, func() {
				require.NoError(t, d.Wait(ctx))
				n++
				sn.fail, snaps.delFail = nil, nil
				if n%2 == 0 {
					sn.fail = func(s string) error {
						if s == step {
							return boom
						}
						return nil
					}
					if step == "prune-catalog" {
						// Only old bodies are pruned; the new one's id is the highest.
						last, _ := d.Store.LastSeq(ctx)
						snaps.delFail = func(id string) error {
							if id < snapshot.IDFor(last, 0) {
								return boom
							}
							return nil
						}
					}
				}
				_, err := sn.Take(ctx)
				if err != nil {
					require.ErrorIs(t, err, boom)
				}
				// Recover as a restarted master would, now.
				want := dumpMaster(t, d.Master)
				r, err := Open(ctx, &readOnly{d.Store}, snapCfg(clk), WithSnapshots(snaps, cat))
				require.NoError(t, err, "recovery after a crash at %q", step)
				require.Equal(t, want, dumpMaster(t, r.Master))
				require.NoError(t, r.Close())
			})
			require.NoError(t, d.Close())
		})
	}
}

// readOnly lets a recovery read a live store without closing it.
type readOnly struct{ Store }

func (readOnly) Close() error { return nil }

// TestOpenWithSnapshotsFailsClosed: an unreachable catalog, a missing
// body, and a log with a gap after the snapshot all fail the open.
func TestOpenWithSnapshotsFailsClosed(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	dir := t.TempDir()
	clk := clock.NewFake(t1)
	snaps := newMemSnaps()
	cat := memCatalog{snaps}
	opts := LocalOptions{SegmentBytes: 4 << 10}
	d, err := OpenDurable(ctx, dir, snapCfg(clk), opts, WithSnapshots(snaps, cat))
	require.NoError(t, err, "no snapshot yet: start from seq 1")
	sn, err := NewSnapshotter(d.Store, SnapshotConfig{Payloads: snaps, Catalog: cat, Master: snapCfg(clk), LogRetain: -1})
	require.NoError(t, err)
	res, err := sn.Take(ctx)
	require.NoError(t, err)
	require.True(t, res.Unchanged, "an empty log has nothing to snapshot")
	require.Empty(t, snaps.ids())
	empty, meta, err := LoadLatest(ctx, snaps, cat, snapCfg(clk))
	require.NoError(t, err, "nothing published: an empty master")
	require.Zero(t, meta)
	require.Empty(t, empty.AllKeys())
	require.NoError(t, empty.Close())
	workload.Drive(t, d.Master, clk, 0, 3, 1500, nil)
	require.NoError(t, d.Wait(ctx))
	res, err = sn.Take(ctx)
	require.NoError(t, err)
	require.NoError(t, d.Close())

	snaps.fail = errors.New("connection refused")
	_, err = OpenDurable(ctx, dir, snapCfg(clk), opts, WithSnapshots(snaps, cat))
	require.ErrorContains(t, err, "connection refused")
	_, _, err = LoadLatest(ctx, snaps, cat, snapCfg(clk))
	require.ErrorContains(t, err, "connection refused")
	snaps.fail = nil

	body := snaps.bodies[res.Meta.ID]
	delete(snaps.bodies, res.Meta.ID)
	_, err = OpenDurable(ctx, dir, snapCfg(clk), opts, WithSnapshots(snaps, cat))
	require.ErrorIs(t, err, snapshot.ErrNotFound)
	snaps.bodies[res.Meta.ID] = body

	// A catalog whose latest is older than the log's start: a gap.
	snaps.metas = []snapshot.Meta{{ID: snapshot.IDFor(1, 1), Seq: 1, Term: 1}}
	_, err = OpenDurable(ctx, dir, snapCfg(clk), opts, WithSnapshots(snaps, cat))
	require.ErrorContains(t, err, "are lost")
}

// TestSnapshotLocalBackends runs the snapshotter on the local payload
// store and catalog: a body orphaned by a crash before its publish is
// cleaned by a later snapshot, retention holds, recovery matches.
func TestSnapshotLocalBackends(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	dir, sdir := t.TempDir(), t.TempDir()
	clk := clock.NewFake(t1)
	pl, err := snapshot.NewLocalPayloads(sdir)
	require.NoError(t, err)
	cat, err := snapshot.NewLocalCatalog(sdir)
	require.NoError(t, err)
	defer cat.Close()
	opts := LocalOptions{SegmentBytes: 8 << 10}
	d, err := OpenDurable(ctx, dir, snapCfg(clk), opts, WithSnapshots(pl, cat))
	require.NoError(t, err)
	sn, err := NewSnapshotter(d.Store, SnapshotConfig{Payloads: pl, Catalog: cat, Master: snapCfg(clk), Retain: 2, LogRetain: 10})
	require.NoError(t, err)
	var orphan string
	n := 0
	workload.Drive(t, d.Master, clk, 0, 11, 3000, func() {
		require.NoError(t, d.Wait(ctx))
		n++
		sn.fail = nil
		if n == 2 {
			sn.fail = func(s string) error {
				if s == "payload" {
					return errors.New("crash before publish")
				}
				return nil
			}
		}
		res, err := sn.Take(ctx)
		if n == 2 {
			require.Error(t, err)
			orphan = res.Meta.ID
			require.NotEmpty(t, orphan)
			return
		}
		require.NoError(t, err)
	})
	require.NoError(t, d.Wait(ctx))
	want := dumpMaster(t, d.Master)
	require.NoError(t, d.Close())
	ids, err := pl.IDs(ctx)
	require.NoError(t, err)
	require.NotContains(t, ids, orphan, "the orphan body was cleaned")
	ms, err := cat.List(ctx)
	require.NoError(t, err)
	require.Len(t, ms, 2)
	require.ElementsMatch(t, []string{ms[0].ID, ms[1].ID}, ids)

	d, err = OpenDurable(ctx, dir, snapCfg(clk), opts, WithSnapshots(pl, cat))
	require.NoError(t, err)
	defer d.Close()
	require.Equal(t, ms[1].ID, d.Snapshot.ID)
	require.Equal(t, want, dumpMaster(t, d.Master))

	// A standby starts from the latest snapshot and replays the rest.
	m, meta, err := LoadLatest(ctx, pl, cat, snapCfg(clk))
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, ms[1], meta)
	last, err := d.Store.LastSeq(ctx)
	require.NoError(t, err)
	_, _, err = replayLog(ctx, d.Store, m, meta.Seq+1, last)
	require.NoError(t, err)
	require.Equal(t, want, dumpMaster(t, m))
}
