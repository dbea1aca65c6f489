package ha

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/ha/internal/workload"
	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/store/master"
)

// opRec is an OpSink keeping what the master logs.
type opRec struct {
	mu  sync.Mutex
	ops []*master.Op
}

func (r *opRec) Append(op *master.Op) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// sampleLog runs the workload on a master and returns its log as sealed
// entries of term 1 and the master's final state.
func sampleLog(t *testing.T, steps int) ([]oplog.Entry, string) {
	t.Helper()
	rec := &opRec{}
	clk := newClock()
	m, err := master.New(master.Config{Shards: 8, Clock: clk, OpLog: rec, Seed: 1})
	require.NoError(t, err)
	defer m.Close()
	workload.Drive(t, m, clk, 0, 5, steps, nil)
	es := make([]oplog.Entry, len(rec.ops))
	for i, op := range rec.ops {
		e, err := oplog.FromOp(op)
		require.NoError(t, err)
		e.Seq, e.Term = uint64(i+1), 1
		e.Seal()
		es[i] = e
	}
	require.Greater(t, len(es), 100)
	return es, dump(t, m)
}

// resealed is e with another key (other bytes, a valid checksum).
func resealed(e oplog.Entry, key string) oplog.Entry {
	e.Key = key
	e.Seal()
	return e
}

func TestApplierInOrderAndOutOfOrder(t *testing.T) {
	es, want := sampleLog(t, 600)
	t.Run("in order", func(t *testing.T) {
		m := newReplica(t, newClock())
		a := NewApplier(m, 0, ApplierOptions{})
		require.NoError(t, a.Apply(es...))
		require.NoError(t, a.Complete(uint64(len(es))))
		assert.EqualValues(t, len(es), a.Applied())
		assert.Equal(t, want, dump(t, m))
	})
	t.Run("out of order", func(t *testing.T) {
		m := newReplica(t, newClock())
		a := NewApplier(m, 0, ApplierOptions{MaxPending: 16})
		// Each run of 16 reversed: all but its first seq wait in the buffer.
		for i := 0; i < len(es); i += 16 {
			run := es[i:min(i+16, len(es))]
			for j := len(run) - 1; j >= 0; j-- {
				require.NoError(t, a.Apply(run[j]))
			}
			require.Zero(t, a.Pending())
			require.EqualValues(t, i+len(run), a.Applied())
		}
		assert.Equal(t, want, dump(t, m))
	})
	t.Run("resent", func(t *testing.T) {
		m := newReplica(t, newClock())
		a := NewApplier(m, 0, ApplierOptions{})
		half := len(es) / 2
		require.NoError(t, a.Apply(es[:half]...))
		before := dump(t, m)
		require.NoError(t, a.Apply(es[:half]...), "already applied, same bytes: skipped")
		require.NoError(t, a.Apply(es[half-1]))
		assert.Equal(t, before, dump(t, m))
		require.NoError(t, a.Apply(es[half-5:]...))
		assert.Equal(t, want, dump(t, m))
	})
	t.Run("from a snapshot seq", func(t *testing.T) {
		m := newReplica(t, newClock())
		pre := NewApplier(m, 0, ApplierOptions{})
		require.NoError(t, pre.Apply(es[:100]...)) // the "snapshot" at seq 100
		a := NewApplier(m, 100, ApplierOptions{})
		require.NoError(t, a.Apply(es[50:]...), "below the start: skipped unchecked")
		assert.Equal(t, want, dump(t, m))
	})
}

// Every way the applier fails closed: a typed error naming the seq,
// nothing applied from then on, the same error for every later call.
func TestApplierFailsClosed(t *testing.T) {
	es, _ := sampleLog(t, 300)
	other := func(e oplog.Entry) oplog.Entry { return resealed(e, e.Key+"-other") }
	badCRC := es[10]
	badCRC.CRC ^= 1
	lowTerm := es[10]
	lowTerm.Term = 0
	lowTerm.Seal()
	divergedOp, err := oplog.FromOp(&master.Op{Kind: master.OpPutEnd, Key: "never-put", Client: master.UUID{Hi: 9, Lo: 9}})
	require.NoError(t, err)
	divergedOp.Seq, divergedOp.Term = 11, 1
	divergedOp.Seal()
	badKind := es[10]
	badKind.Kind = 200
	badKind.Seal()

	for _, tc := range []struct {
		name   string
		opts   ApplierOptions
		feed   func(a *Applier) error // after seqs 1..10 are applied
		reason error
		cause  error
		seq    uint64
	}{
		{name: "gap: the log holds more", reason: ErrGap, seq: 11,
			feed: func(a *Applier) error {
				if err := a.Apply(es[11:20]...); err != nil {
					return err
				}
				return a.Complete(20)
			}},
		{name: "gap: buffer full", opts: ApplierOptions{MaxPending: 4}, reason: ErrGap, seq: 11,
			feed: func(a *Applier) error { return a.Apply(es[11:20]...) }},
		{name: "gap: buffer bytes", opts: ApplierOptions{MaxPendingBytes: 1}, reason: ErrGap, seq: 11,
			feed: func(a *Applier) error { return a.Apply(es[12]) }},
		{name: "regression of an applied seq", reason: ErrRegression, seq: 5,
			feed: func(a *Applier) error { return a.Apply(other(es[4])) }},
		{name: "regression of a buffered seq", reason: ErrRegression, seq: 14,
			feed: func(a *Applier) error { return a.Apply(es[13], other(es[13])) }},
		{name: "checksum", reason: ErrChecksum, cause: oplog.ErrCorrupt, seq: 11,
			feed: func(a *Applier) error { return a.Apply(badCRC) }},
		{name: "checksum of a resent seq", reason: ErrChecksum, cause: oplog.ErrCorrupt, seq: 3,
			feed: func(a *Applier) error { c := es[2]; c.CRC++; return a.Apply(c) }},
		{name: "term backwards", reason: ErrTermRegressed, seq: 11,
			feed: func(a *Applier) error { return a.Apply(lowTerm) }},
		{name: "replay diverged", reason: ErrDiverged, cause: master.ErrReplayDiverged, seq: 11,
			feed: func(a *Applier) error { return a.Apply(divergedOp) }},
		{name: "op does not decode", reason: ErrDiverged, cause: oplog.ErrBadOp, seq: 11,
			feed: func(a *Applier) error { return a.Apply(badKind) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newReplica(t, newClock())
			a := NewApplier(m, 0, tc.opts)
			require.NoError(t, a.Apply(es[:10]...))
			if tc.reason == ErrTermRegressed {
				// Entries of term 1 so far; the bad one has term 0.
				require.EqualValues(t, 1, es[9].Term)
			}
			before := dump(t, m)
			err := tc.feed(a)
			require.ErrorIs(t, err, tc.reason)
			if tc.cause != nil {
				require.ErrorIs(t, err, tc.cause)
			}
			var ae *ApplyError
			require.True(t, errors.As(err, &ae))
			assert.Equal(t, tc.seq, ae.Seq)
			assert.Equal(t, err, a.Err())
			assert.EqualValues(t, 10, a.Applied())
			assert.Equal(t, before, dump(t, m), "nothing applied after the fault")
			assert.Equal(t, err, a.Apply(es[10:]...), "fails closed: later entries refused")
			assert.Equal(t, err, a.Complete(10))
			assert.EqualValues(t, 10, a.Applied())
			assert.Zero(t, a.Pending())
			assert.Equal(t, before, dump(t, m))
		})
	}
}
