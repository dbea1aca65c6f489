package master

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/alloc"
)

func exportAll(t testing.TB, m *Master) ([]*Record, ExportStats) {
	t.Helper()
	var recs []*Record
	n := m.ExportCount()
	st, err := m.Export(func(r *Record) error { recs = append(recs, r); return nil })
	require.NoError(t, err)
	require.Len(t, recs, n, "ExportCount")
	require.Equal(t, n, st.Records)
	return recs, st
}

func importAll(t testing.TB, m *Master, recs []*Record) error {
	t.Helper()
	i := 0
	return m.Import(func() (*Record, error) {
		if i == len(recs) {
			return nil, nil
		}
		i++
		return recs[i-1], nil
	})
}

func dumpBytes(t testing.TB, m *Master) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, m.DumpState(&b))
	return b.String()
}

// TestExportImport exports the master at checkpoints of a random
// workload, imports each export into a fresh master with another shard
// count and replays the rest of the log on it: the import equals the
// master at the checkpoint, and the replay never diverges (every later
// allocation and mount lands where the master put it) and ends equal.
func TestExportImport(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			e := newEnv(t, nil)
			type cp struct {
				n    int
				dump string
				st   state
				recs []*Record
				gen  uint64
			}
			var cps []cp
			drive(t, e, seed, 6000, func() {
				recs, _ := exportAll(t, e.m)
				cps = append(cps, cp{len(e.log.all()), dumpBytes(t, e.m), dumpState(e.m), recs, e.m.putGen.Load()})
			})
			ops := e.log.all()
			final := dumpBytes(t, e.m)
			for _, c := range cps {
				m, err := New(Config{Shards: 3, Clock: e.clk, Seed: 7})
				require.NoError(t, err)
				require.NoError(t, importAll(t, m, c.recs))
				require.Equal(t, c.dump, dumpBytes(t, m), "import at op %d", c.n)
				require.Empty(t, diffState(c.st, dumpState(m)), "import at op %d", c.n)
				require.Equal(t, c.gen, m.putGen.Load())
				checkInvariants(t, m)
				for i, op := range ops[c.n:] {
					require.NoError(t, m.Replay(op), "op %d (%v %q) after an import at op %d", c.n+i, op.Kind, op.Key, c.n)
				}
				require.Equal(t, final, dumpBytes(t, m), "import at op %d, then the rest of the log", c.n)
				require.NoError(t, m.Close())
			}
		})
	}
}

// TestExportImportNextPut: after an import, a put lands at the same
// address on both masters.
func TestExportImportNextPut(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "h1", 1<<20)
	for i := range 40 {
		e.put(cl(1), fmt.Sprint("k", i), uint64(1000+i*300), ReplicateConfig{})
	}
	for i := 0; i < 40; i += 3 {
		require.NoError(t, e.m.Remove(fmt.Sprint("k", i), true))
	}
	recs, st := exportAll(t, e.m)
	require.Equal(t, 40-14, st.Objects)
	m, err := New(Config{Shards: 5, Clock: e.clk, Seed: 1})
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, importAll(t, m, recs))
	for i := range 10 {
		k, size := fmt.Sprint("n", i), uint64(500+i*700)
		a, err := e.m.PutStart(cl(1), k, size, ReplicateConfig{})
		require.NoError(t, err)
		b, err := m.PutStart(cl(1), k, size, ReplicateConfig{})
		require.NoError(t, err)
		require.Equal(t, a[0].Addr, b[0].Addr, "put %d", i)
	}
}

func TestImportRefusesBadRecords(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "h1", 1<<20)
	e.put(cl(1), "a", 4096, ReplicateConfig{})
	recs, _ := exportAll(t, e.m)
	fresh := func() *Master {
		m, err := New(Config{Shards: 2, Clock: e.clk})
		require.NoError(t, err)
		t.Cleanup(func() { m.Close() })
		return m
	}
	// The object's replica moved off its allocated range.
	bad := make([]*Record, len(recs))
	for i, r := range recs {
		c := *r
		if c.Kind == RecordObject {
			c.Addrs = []uint64{r.Addrs[0] + 64}
		}
		bad[i] = &c
	}
	require.ErrorIs(t, importAll(t, fresh(), bad), ErrBadSnapshot)
	// An allocated range no replica holds.
	var noObj []*Record
	for _, r := range recs {
		if r.Kind != RecordObject {
			noObj = append(noObj, r)
		}
	}
	require.ErrorIs(t, importAll(t, fresh(), noObj), ErrBadSnapshot)
	// No table first.
	require.ErrorIs(t, importAll(t, fresh(), recs[1:]), ErrBadSnapshot)
	// Into a master that is not empty.
	require.Error(t, importAll(t, e.m, recs))
}

func TestFindAddr(t *testing.T) {
	var ps []alloc.Placement
	addr := uint64(1 << 30)
	for i := range 1000 {
		addr += uint64(64 * (1 + i%7 + (i/100)*50)) // uneven spacing
		ps = append(ps, alloc.Placement{Addr: addr})
	}
	for i, p := range ps {
		j, ok := findAddr(ps, p.Addr)
		require.True(t, ok)
		require.Equal(t, i, j)
		_, ok = findAddr(ps, p.Addr+1)
		require.False(t, ok)
		_, ok = findAddr(ps, p.Addr-1)
		require.False(t, ok)
	}
	_, ok := findAddr(nil, 5)
	require.False(t, ok)
	j, ok := findAddr(ps[:1], ps[0].Addr)
	require.True(t, ok)
	require.Zero(t, j)
}

// TestExportWhileServing exports a master while puts and removes run on
// it: no lock is held across the export (each hold is measured), and
// the export finishes with the load running.
func TestExportWhileServing(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.OpLog = nil; c.Events = nil })
	e.mount(cl(1), "h1", 64<<20)
	e.mount(cl(2), "h2", 64<<20)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := fmt.Sprint("k", i%500)
			if _, err := e.m.PutStart(cl(1), k, 4096, ReplicateConfig{Replicas: 2}); err == nil {
				_ = e.m.PutEnd(cl(1), k, Memory, nil)
			} else {
				_ = e.m.Remove(k, true)
			}
		}
	}()
	for range 20 {
		n := 0
		st, err := e.m.Export(func(*Record) error { n++; return nil })
		require.NoError(t, err)
		require.Equal(t, n, st.Records)
		require.Positive(t, st.LongestShardHold)
		require.LessOrEqual(t, st.LongestShardHold, st.LongestHold)
		require.LessOrEqual(t, st.LongestHold, st.Took)
	}
	close(stop)
	<-done
}
