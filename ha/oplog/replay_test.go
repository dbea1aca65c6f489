package oplog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
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

// driveMaster runs a random mix of every kind of operation through m's
// public API (as store/master's own oplog test does): puts finished,
// revoked, abandoned and taken over, removes of every kind, eviction,
// reservations, mounts, unmounts, expiry and remounts, with the fake clock
// moving. checkpoint runs every 500 steps.
func driveMaster(t *testing.T, m *master.Master, clk *clock.Fake, seed uint64, steps int, checkpoint func()) {
	r := rand.New(rand.NewPCG(seed, seed+1))
	cl := func(n uint64) master.UUID { return master.UUID{Hi: 0xc1, Lo: n} }
	clients := []master.UUID{cl(1), cl(2), cl(3), cl(4)}
	segsOf := map[master.UUID][]alloc.Segment{}
	alive := map[master.UUID]bool{}
	nseg := 0
	mount := func(c master.UUID) {
		nseg++
		s := alloc.Segment{ID: master.UUID{Hi: 0x5e, Lo: uint64(nseg)}, Name: fmt.Sprintf("host%d", c.Lo),
			Base: uint64(nseg) << 40, Size: uint64(256+r.IntN(768)) << 10, Protocol: "tcp", TEEndpoint: fmt.Sprintf("10.0.0.%d:1", c.Lo)}
		require.NoError(t, m.MountSegment(c, s))
		s.Client = c
		segsOf[c] = append(segsOf[c], s)
		alive[c] = true
	}
	for _, c := range clients[:3] {
		mount(c)
	}
	key := func() string { return fmt.Sprintf("k%03d", r.IntN(300)) }
	type put struct {
		c   master.UUID
		k   string
		gen uint64
	}
	var pending []put
	config := func() master.ReplicateConfig {
		rc := master.ReplicateConfig{Replicas: 1 + r.IntN(3)}
		switch r.IntN(10) {
		case 0:
			rc.SoftPin = true
			if r.IntN(2) == 0 {
				rc.SoftPinTTL = time.Duration(1+r.IntN(60)) * time.Second
			}
		case 1:
			rc.HardPin = true
		case 2:
			rc.Preferred = []string{fmt.Sprintf("host%d", 1+r.IntN(4))}
		}
		return rc
	}
	block := func() *master.BlockMeta {
		b := &master.BlockMeta{BlockHashes: []uint64{r.Uint64()}}
		if r.IntN(3) == 0 {
			b.HasParent, b.ParentHash, b.TokenIDs, b.BlockSize = true, r.Uint64(), []uint32{r.Uint32(), r.Uint32()}, 16
		}
		if r.IntN(5) == 0 {
			b.HasLora, b.LoraID, b.LoraName = true, r.Int64(), "lora"
		}
		return b
	}
	type held struct {
		c  master.UUID
		id uint64
	}
	var resv []held
	for step := range steps {
		if checkpoint != nil && step%500 == 0 {
			checkpoint()
		}
		c := clients[r.IntN(len(clients))]
		if r.IntN(100) < 12 {
			switch x := r.IntN(5); {
			case x < 2:
				res := m.Reserve(c, master.ReserveSpec{Size: uint64(1 + r.IntN(16<<10)), Config: config(), Count: 1 + r.IntN(3)})
				for _, rv := range res.Reservations {
					resv = append(resv, held{c, rv.ID})
				}
			case x < 4 && len(resv) > 0:
				i := r.IntN(len(resv))
				h := resv[i]
				by := h.c
				if r.IntN(10) == 0 {
					by = clients[r.IntN(len(clients))]
				}
				err := m.Commit(by, []master.CommitItem{{Key: key(), ID: h.id, Block: block()}})[0]
				if err == nil || errors.Is(err, errcode.ErrReplicaIsGone) {
					resv = slices.Delete(resv, i, i+1)
				}
			case len(resv) > 0:
				i := r.IntN(len(resv))
				m.Unreserve(resv[i].c, []uint64{resv[i].id})
				resv = slices.Delete(resv, i, i+1)
			}
			continue
		}
		switch n := r.IntN(100); {
		case n < 25:
			k := key()
			if _, gen, err := m.PutStartGen(c, k, uint64(1+r.IntN(16<<10)), config()); err == nil {
				pending = append(pending, put{c, k, gen})
			}
		case n < 50:
			if len(pending) > 0 {
				i := r.IntN(len(pending))
				p := pending[i]
				pending = slices.Delete(pending, i, i+1)
				gen := p.gen
				switch r.IntN(6) {
				case 0:
					gen = 0
				case 1:
					gen = p.gen + 1
				}
				if r.IntN(8) == 0 {
					m.PutRevokeGen(p.c, p.k, gen, master.Memory)
				} else if r.IntN(10) != 0 {
					m.PutEndGen(p.c, p.k, gen, master.Memory, block())
				}
			}
		case n < 60:
			m.GetReplicaList(key())
		case n < 65:
			m.ExistKey(key(), r.IntN(2) == 0)
		case n < 72:
			m.Remove(key(), r.IntN(3) == 0)
		case n < 73:
			m.BatchRemove([]string{key(), key()}, false)
		case n < 74:
			m.RemoveByRegex(fmt.Sprintf("k%d.*", r.IntN(3)), r.IntN(2) == 0)
		case n < 75:
			if r.IntN(4) == 0 {
				m.RemoveAll(r.IntN(2) == 0)
			}
		case n < 78:
			m.Evict()
		case n < 80:
			if len(segsOf[c]) < 3 {
				mount(c)
			}
		case n < 82:
			if ss := segsOf[c]; len(ss) > 0 {
				i := r.IntN(len(ss))
				if err := m.UnmountSegment(c, ss[i].ID); err == nil {
					segsOf[c] = slices.Delete(ss, i, i+1)
				}
			}
		case n < 84:
			if !alive[c] || r.IntN(4) == 0 {
				alive[c] = !alive[c]
			}
		case n < 86:
			if _, st := m.Ping(c); st == master.ClientNeedRemount && alive[c] {
				var keep []alloc.Segment
				for _, s := range segsOf[c] {
					if _, err := m.QuerySegmentStatus(s.ID); err != nil {
						s.ID.Lo += 1000
					}
					keep = append(keep, s)
				}
				require.NoError(t, m.ReMountSegment(c, keep))
				segsOf[c] = keep
			}
		default:
			clk.Advance(time.Duration(r.IntN(3000)) * time.Millisecond)
			if r.IntN(40) == 0 {
				clk.Advance(time.Duration(r.IntN(700)) * time.Second)
			}
			for _, c := range clients {
				if alive[c] {
					m.Ping(c)
				}
			}
			m.Tick()
		}
	}
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
			driveMaster(t, m, clk, seed, 6000, checkpoint)
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
	driveMaster(t, m, clk, 7, 3000, func() {})
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
