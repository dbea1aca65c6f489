package oplog

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/ha/internal/workload"
	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/master"
)

// opTee records every op the master logs and hands it on.
type opTee struct {
	mu   sync.Mutex
	ops  []*master.Op
	next master.OpSink
}

func (t *opTee) Append(op *master.Op) {
	t.mu.Lock()
	t.ops = append(t.ops, op)
	t.mu.Unlock()
	t.next.Append(op)
}

func dumpMaster(t *testing.T, m *master.Master) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, m.DumpState(&b))
	return b.String()
}

// normalOp is op with empty lists as nil (the codec omits them).
func normalOp(op *master.Op) *master.Op {
	c := *op
	if len(c.Segments) == 0 {
		c.Segments = nil
	}
	if len(c.Addrs) == 0 {
		c.Addrs = nil
	}
	if c.Block != nil {
		b := *c.Block
		if len(b.BlockHashes) == 0 {
			b.BlockHashes = nil
		}
		if len(b.TokenIDs) == 0 {
			b.TokenIDs = nil
		}
		c.Block = &b
	}
	return &c
}

// TestSinkReplay: a master under a random mix of every operation logs
// through a Sink; every entry read back from the store decodes to the op
// logged, and replaying them on a fresh master (another shard count)
// reproduces the leader's state at every checkpoint.
func TestSinkReplay(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			ctx := context.Background()
			st := newMemStore()
			sink, err := NewSink(ctx, st, SinkConfig{Term: 3})
			require.NoError(t, err)
			rec := &opTee{next: sink}
			clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
			m, err := master.New(master.Config{Shards: 8, Clock: clk, OpLog: rec, Seed: 1})
			require.NoError(t, err)
			type snap struct {
				seq  uint64
				dump string
			}
			var snaps []snap
			checkpoint := func() {
				seq := sink.Appended()
				require.NoError(t, sink.WaitDurable(ctx, seq))
				snaps = append(snaps, snap{seq, dumpMaster(t, m)})
			}
			workload.Drive(t, m, clk, 0, seed, 6000, checkpoint)
			checkpoint()
			require.NoError(t, m.Close())
			require.NoError(t, sink.Close())

			es := st.all(t)
			require.Len(t, es, len(rec.ops))
			require.Equal(t, uint64(len(es)), sink.Durable())
			kinds := map[master.OpKind]int{}
			standby, err := master.New(master.Config{Shards: 3, Clock: clk, Seed: 99})
			require.NoError(t, err)
			defer standby.Close()
			done := 0
			for _, sn := range snaps {
				for ; uint64(done) < sn.seq; done++ {
					e := es[done]
					require.Equal(t, uint64(done+1), e.Seq)
					require.Equal(t, uint64(3), e.Term)
					require.NoError(t, e.Verify())
					op, err := DecodeOp(&e)
					require.NoError(t, err, "seq %d", e.Seq)
					require.Equal(t, normalOp(rec.ops[done]), op, "seq %d", e.Seq)
					kinds[op.Kind]++
					require.NoError(t, standby.Replay(op), "seq %d (%v %q)", e.Seq, op.Kind, op.Key)
				}
				require.Equal(t, sn.dump, dumpMaster(t, standby), "after %d entries", sn.seq)
			}
			require.Equal(t, len(es), done)
			for k := master.OpPutStart; k <= maxKind; k++ {
				require.NotZero(t, kinds[k], "the mix never produced %v (%v)", k, kinds)
			}
			a, b := m.Stats(), standby.Stats()
			require.Equal(t, a.Keys, b.Keys)
			require.Equal(t, a.Allocated, b.Allocated)
			require.Equal(t, a.PendingKeys, b.PendingKeys)
			t.Logf("%d entries, %d checkpoints: %v", len(es), len(snaps), kinds)
		})
	}
}

// The sink over the local-file backend: a master's whole op stream is
// durable in the files, and a master rebuilt from them after a reopen
// has the same state.
func TestSinkReplayLocal(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	dir := t.TempDir()
	st, err := OpenLocal(dir, LocalOptions{SegmentBytes: 64 << 10})
	require.NoError(t, err)
	sink, err := NewSink(ctx, st, SinkConfig{Term: 5})
	require.NoError(t, err)
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	m, err := master.New(master.Config{Shards: 8, Clock: clk, OpLog: sink, Seed: 1})
	require.NoError(t, err)
	workload.Drive(t, m, clk, 0, 7, 3000, func() {})
	last := sink.Appended()
	require.NoError(t, sink.WaitDurable(ctx, last))
	want := dumpMaster(t, m)
	require.NoError(t, m.Close())
	require.NoError(t, sink.Close())
	require.NoError(t, st.Close())

	st, err = OpenLocal(dir, LocalOptions{})
	require.NoError(t, err)
	defer st.Close()
	got, err := st.LastSeq(ctx)
	require.NoError(t, err)
	require.Equal(t, last, got)
	standby, err := master.New(master.Config{Shards: 3, Clock: clk, Seed: 99})
	require.NoError(t, err)
	defer standby.Close()
	next := uint64(1)
	for next <= last {
		es, err := st.Read(ctx, next, 256)
		require.NoError(t, err)
		require.NotEmpty(t, es, "seq %d", next)
		for i := range es {
			require.Equal(t, next, es[i].Seq)
			op, err := DecodeOp(&es[i])
			require.NoError(t, err, "seq %d", next)
			require.NoError(t, standby.Replay(op), "seq %d", next)
			next++
		}
	}
	require.Equal(t, want, dumpMaster(t, standby))
}
