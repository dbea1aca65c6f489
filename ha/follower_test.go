package ha

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/crescent-kv/crescent/ha/internal/workload"
	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store/master"
)

// logPair is a log as its writer and a follower see it: the same Local
// store (one process holds a data directory), or two etcd stores on
// their own clients.
type logPair struct {
	writer, reader oplog.Store
}

type backend struct {
	name string
	open func(t *testing.T) logPair
}

var backends = []backend{
	{"local", func(t *testing.T) logPair {
		st, err := oplog.OpenLocal(t.TempDir(), oplog.LocalOptions{SegmentBytes: 256 << 10})
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		return logPair{st, st}
	}},
	{"etcd", func(t *testing.T) logPair {
		e := testsvc.StartEtcd(t)
		w := openEtcd(t, newEtcdCli(t, e), 1)
		r := openEtcd(t, newEtcdCli(t, e), 0)
		return logPair{w, r}
	}},
}

func newEtcdCli(t testing.TB, e *testsvc.Etcd) *clientv3.Client {
	t.Helper()
	cfg := oplog.EtcdClientConfig([]string{e.Endpoint})
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

func openEtcd(t testing.TB, cli *clientv3.Client, term uint64) *oplog.Etcd {
	t.Helper()
	s, err := oplog.OpenEtcd(ctxT(t), cli, oplog.EtcdOptions{ClusterID: "c1", Term: term})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// leader is a master logging to a store through a Sink.
type leader struct {
	m       *master.Master
	sink    *oplog.Sink
	workers uint64 // started so far: each gets its own clients and segments
}

func newLeader(t *testing.T, st oplog.Store) *leader {
	t.Helper()
	sink, err := oplog.NewSink(ctxT(t), st, oplog.SinkConfig{Term: 1})
	require.NoError(t, err)
	m, err := master.New(master.Config{Shards: 8, Clock: newClock(), OpLog: sink, Seed: 1})
	require.NoError(t, err)
	t.Cleanup(func() {
		m.Close()
		sink.Close()
	})
	return &leader{m: m, sink: sink}
}

// load runs workers concurrently on the leader.
func (l *leader) load(t *testing.T, workers, steps int, seed uint64) {
	var wg sync.WaitGroup
	for range workers {
		w := l.workers
		l.workers++
		wg.Add(1)
		go func() {
			defer wg.Done()
			workload.Drive(t, l.m, fakeOf(l.m), w, seed+w, steps, nil)
		}()
	}
	wg.Wait()
}

// durable waits until all the leader logged is durable and returns its
// last seq.
func (l *leader) durable(t *testing.T) uint64 {
	t.Helper()
	seq := l.sink.Appended()
	require.NoError(t, l.sink.WaitDurable(ctxT(t), seq))
	return seq
}

func newFollower(t *testing.T, st oplog.Store, m *master.Master, applied uint64, opts FollowerOptions) *Follower {
	t.Helper()
	f, err := NewFollower(st, m, applied, opts)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

// A follower tailing a master under concurrent load (every kind of op,
// from several goroutines) ends with exactly the leader's state; paused
// mid-load its replica holds still.
func TestFollowerTailsLoadedMaster(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			lp := b.open(t)
			ld := newLeader(t, lp.writer)
			replica := newReplica(t, newClock())
			f := newFollower(t, lp.reader, replica, 0, FollowerOptions{})
			reg := prometheus.NewPedanticRegistry()
			require.NoError(t, f.Register(reg))

			done := make(chan struct{})
			go func() {
				defer close(done)
				ld.load(t, 3, 2500, 11)
			}()
			// Pause while the load runs: nothing moves until Resume.
			require.NoError(t, f.WaitApplied(ctxT(t), 50))
			require.NoError(t, f.Pause(ctxT(t)))
			at, snap := f.Applied(), dump(t, replica)
			require.NoError(t, f.Pause(ctxT(t)), "pausing twice is fine")
			assert.Equal(t, at, f.Applied())
			assert.Equal(t, snap, dump(t, replica), "a paused replica is quiescent")
			require.NoError(t, f.Resume())
			<-done

			last := ld.durable(t)
			if err := f.WaitApplied(ctxT(t), last); err != nil {
				explain(t, lp.reader, err)
				require.NoError(t, err)
			}
			assert.Equal(t, dump(t, ld.m), dump(t, replica))
			require.NoError(t, f.Err())
			st := f.Stats()
			assert.Equal(t, last, st.Applied)
			assert.Equal(t, last, st.Entries)
			assert.Zero(t, st.ApplyErrors)
			require.Eventually(t, func() bool { return f.Lag() == 0 }, wait, time.Millisecond)
			fams, err := reg.Gather()
			require.NoError(t, err)
			got := map[string]float64{}
			for _, mf := range fams {
				for _, m := range mf.GetMetric() {
					got[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
			assert.EqualValues(t, last, got["crescent_ha_follower_applied_seq"])
			assert.Contains(t, got, "crescent_ha_follower_lag_entries")
			assert.Contains(t, got, "crescent_ha_follower_apply_errors_total")
			t.Logf("%d entries followed; stats %+v", last, st)
		})
	}
}

// A follower started late, from seq 0 with a long log, catches up in
// batches and keeps following.
func TestFollowerLateStart(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			lp := b.open(t)
			ld := newLeader(t, lp.writer)
			ld.load(t, 1, 6000, 21)
			last := ld.durable(t)
			replica := newReplica(t, newClock())
			f := newFollower(t, lp.reader, replica, 0, FollowerOptions{Batch: 100})
			require.NoError(t, f.WaitApplied(ctxT(t), last))
			assert.Equal(t, dump(t, ld.m), dump(t, replica))

			ld.load(t, 2, 500, 99)
			last = ld.durable(t)
			require.NoError(t, f.WaitApplied(ctxT(t), last))
			assert.Equal(t, dump(t, ld.m), dump(t, replica))
		})
	}
}

// Handover catches up to the store's end, stops following and gives the
// master with its seq; the follower then refuses everything.
func TestFollowerHandover(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			lp := b.open(t)
			ld := newLeader(t, lp.writer)
			replica := newReplica(t, newClock())
			// A long safety timer and a paused follower: only Handover
			// itself can bring the replica to the end.
			f := newFollower(t, lp.reader, replica, 0, FollowerOptions{Safety: time.Hour})
			require.NoError(t, f.Pause(ctxT(t)))
			ld.load(t, 2, 1500, 5)
			last := ld.durable(t)
			m, seq, err := f.Handover(ctxT(t))
			require.NoError(t, err)
			assert.Same(t, replica, m)
			assert.Equal(t, last, seq)
			assert.Equal(t, dump(t, ld.m), dump(t, m))
			assert.ErrorIs(t, f.Err(), ErrHandedOver)
			assert.NoError(t, f.WaitApplied(ctxT(t), last))
			assert.ErrorIs(t, f.WaitApplied(ctxT(t), last+1), ErrHandedOver)
			assert.ErrorIs(t, f.Pause(ctxT(t)), ErrHandedOver)
			_, _, err = f.Handover(ctxT(t))
			assert.ErrorIs(t, err, ErrHandedOver)

			// Nothing more is applied to the handed-over master.
			ld.load(t, 1, 200, 6)
			ld.durable(t)
			assert.Equal(t, seq, f.Applied())
			require.NoError(t, f.Close())
			assert.ErrorIs(t, f.Err(), ErrHandedOver)
		})
	}
}

// A replica built from a snapshot follows from its seq; one whose next
// seq was compacted away gets ErrResync (and oplog.ErrCompacted).
func TestFollowerCompactedLog(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			lp := b.open(t)
			ld := newLeader(t, lp.writer)
			ld.load(t, 1, 1000, 3)
			last := ld.durable(t)
			require.Greater(t, last, uint64(300))

			// The "snapshot": a replica at seq 200.
			const at = 200
			snap := newReplica(t, newClock())
			es, err := lp.reader.Read(ctxT(t), 1, at)
			require.NoError(t, err)
			require.NoError(t, NewApplier(snap, 0, ApplierOptions{}).Apply(es...))
			require.NoError(t, lp.writer.Compact(ctxT(t), at+1))

			f := newFollower(t, lp.reader, snap, at, FollowerOptions{})
			require.NoError(t, f.WaitApplied(ctxT(t), last))
			assert.Equal(t, dump(t, ld.m), dump(t, snap))

			stale := newFollower(t, lp.reader, newReplica(t, newClock()), 0, FollowerOptions{})
			err = stale.WaitApplied(ctxT(t), last)
			require.ErrorIs(t, err, ErrResync)
			require.ErrorIs(t, err, oplog.ErrCompacted)
			assert.Equal(t, err, stale.Err())
			assert.EqualValues(t, 1, stale.Stats().ApplyErrors)
			_, _, err = stale.Handover(ctxT(t))
			assert.ErrorIs(t, err, ErrResync)
		})
	}
}

// fakeOf is the leader's fake clock.
func fakeOf(m *master.Master) *clock.Fake { return m.Config().Clock.(*clock.Fake) }

// A Handover that cannot finish in time leaves the follower following;
// a later one succeeds.
func TestFollowerHandoverCanceled(t *testing.T) {
	st, err := oplog.OpenLocal(t.TempDir(), oplog.LocalOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	ld := newLeader(t, st)
	replica := newReplica(t, newClock())
	f := newFollower(t, st, replica, 0, FollowerOptions{})
	ld.load(t, 1, 300, 8)
	ctx, cancel := context.WithCancel(ctxT(t))
	cancel()
	_, _, err = f.Handover(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, f.Err())
	last := ld.durable(t)
	require.NoError(t, f.WaitApplied(ctxT(t), last), "still following")
	m, seq, err := f.Handover(ctxT(t))
	require.NoError(t, err)
	assert.Equal(t, last, seq)
	assert.Equal(t, dump(t, ld.m), dump(t, m))
}

// explain logs, when err is an applier's fault, the logged ops up to it
// that touch its key, the reservations committed to that key, or their
// segments: the history that diverged.
func explain(t *testing.T, st oplog.Store, err error) {
	var ae *ApplyError
	if !errors.As(err, &ae) || ae.Seq == 0 {
		return
	}
	var ops []*master.Op
	for next := uint64(1); next <= ae.Seq; {
		es, rerr := st.Read(ctxT(t), next, 1024)
		if rerr != nil || len(es) == 0 {
			return
		}
		for i := range es {
			next = es[i].Seq + 1
			if es[i].Seq > ae.Seq {
				break
			}
			op, derr := oplog.DecodeOp(&es[i])
			if derr != nil {
				return
			}
			ops = append(ops, op)
		}
	}
	key := ops[len(ops)-1].Key
	ids, segs := map[uint64]bool{}, map[uint32]bool{}
	for _, op := range ops {
		if op.Kind == master.OpCommit && op.Key == key {
			ids[op.ID] = true
		}
	}
	for _, op := range ops {
		if op.Key == key || (op.Kind == master.OpReserve && ids[op.ID]) {
			for _, s := range op.Segments {
				segs[s] = true
			}
		}
	}
	for i, op := range ops {
		touches := op.Key != "" && op.Key == key || op.ID != 0 && ids[op.ID]
		if op.Kind == master.OpMount || op.Kind == master.OpUnmountStart || op.Kind == master.OpUnmount {
			touches = touches || len(op.Segments) > 0 && segs[op.Segments[0]]
		}
		if touches {
			t.Logf("seq %d: %v %q client=%v segs=%v addrs=%#x id=%d", i+1, op.Kind, op.Key, op.Client, op.Segments, op.Addrs, op.ID)
		}
	}
}
