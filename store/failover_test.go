package store

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
)

// suspectNames returns the names of the segments the master holds suspect.
func suspectNames(tm *testMaster) []string {
	var out []string
	for _, s := range tm.m.AllSegments() {
		if s.Suspect {
			out = append(out, s.Name)
		}
	}
	return out
}

// TestPutPlacedAgainAfterFailedWrite: a put whose write to a segment
// fails reports the segment and is placed again elsewhere, on every put
// path: Put (two RPCs), BatchPut, and a put-ahead reservation.
func TestPutPlacedAgainAfterFailedWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		put  func(ctx context.Context, a *Client, key string, v []byte, rc ReplicateConfig) error
	}{
		{"put", twoRPCPuts, func(ctx context.Context, a *Client, key string, v []byte, rc ReplicateConfig) error {
			return a.Put(ctx, key, v, rc)
		}},
		{"batch", twoRPCPuts, func(ctx context.Context, a *Client, key string, v []byte, rc ReplicateConfig) error {
			errs := a.BatchPut(ctx, []string{key, key + "/2"}, [][]byte{v, v}, rc)
			if errs[0] == nil {
				return errs[1]
			}
			return errs[0]
		}},
		{"ahead", func(c *Config) { c.PutAhead = 2 }, func(ctx context.Context, a *Client, key string, v []byte, rc ReplicateConfig) error {
			if a.ahead.held() == 0 {
				return fmt.Errorf("no reservation at hand")
			}
			return a.Put(ctx, key, v, rc)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tm := startMaster(t, master.Config{})
			a := newTestClient(t, tm, 16<<20, protocols("tcp"), tc.mod)
			b := newTestClient(t, tm, 16<<20, protocols("tcp"))
			b.hbPaused.Store(true) // b's Ping would clear the flag this test checks
			ctx := tctx(t)
			rc := ReplicateConfig{Preferred: []string{b.SegmentName()}}
			if tc.name == "ahead" {
				warmAhead(t, a, "warm", 4096, rc)
				eventually(t, "a full class", func() bool { return a.ahead.held() == 2 })
			}
			v := testutil.Bytes(4096, 7)
			a.beforeWrite = sync.OnceFunc(func() { b.eng.Close() }) // b's memory becomes unreachable
			err := tc.put(ctx, a, "k", v, rc)
			a.beforeWrite = nil
			require.NoError(t, err)
			assert.Equal(t, []string{a.SegmentName()}, segmentsOf(t, tm, "k"))
			got, err := a.Get(ctx, "k")
			require.NoError(t, err)
			assert.True(t, bytes.Equal(v, got))
			st := a.Stats()
			assert.Equal(t, uint64(1), st.PutRetries)
			assert.Equal(t, uint64(1), st.FailedSegmentReports)
			assert.Equal(t, []string{b.SegmentName()}, suspectNames(tm))
			// b pings: it is alive, placement may use it again.
			b.hbPaused.Store(false)
			eventually(t, "the flag cleared", func() bool { return len(suspectNames(tm)) == 0 })
		})
	}
}

// TestPutRetriesBounded: with every segment failing, a put gives up after
// Config.PutRetries more tries, and one with retries off after the first.
func TestPutRetriesBounded(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 0, protocols("tcp"), twoRPCPuts) // a pure client: nothing local to fall back on
	b := newTestClient(t, tm, 16<<20, protocols("tcp"))
	b.hbPaused.Store(true)
	b.eng.Close()
	ctx := tctx(t)
	err := a.Put(ctx, "k", testutil.Bytes(4096, 1), ReplicateConfig{})
	require.ErrorIs(t, err, errcode.ErrTransferFail)
	assert.Equal(t, uint64(DefaultPutRetries), a.Stats().PutRetries)
	_, err = tm.m.QueryKey("k")
	assert.ErrorIs(t, err, errcode.ErrObjectNotFound)

	c := newTestClient(t, tm, 0, protocols("tcp"), twoRPCPuts, noRetries)
	require.ErrorIs(t, c.Put(ctx, "k", testutil.Bytes(4096, 1), ReplicateConfig{}), errcode.ErrTransferFail)
	assert.Zero(t, c.Stats().PutRetries)
}

// TestMinReplicasClient: MinReplicas reaches the master, a put that
// cannot place them fails with NO_AVAILABLE_HANDLE, and what was stored
// shows in Stats.
func TestMinReplicasClient(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 16<<20, twoRPCPuts)
	ctx := tctx(t)
	err := a.Put(ctx, "two", []byte("v"), ReplicateConfig{Replicas: 2, MinReplicas: 2})
	require.ErrorIs(t, err, errcode.ErrNoAvailableHandle)
	assert.Contains(t, err.Error(), "2 replicas required")
	errs := a.BatchPut(ctx, []string{"b1", "b2"}, [][]byte{[]byte("v"), []byte("v")}, ReplicateConfig{Replicas: 2, MinReplicas: 2})
	for _, err := range errs {
		require.ErrorIs(t, err, errcode.ErrNoAvailableHandle)
	}
	assert.Empty(t, tm.m.AllKeys())
	require.ErrorIs(t, a.Put(ctx, "bad", []byte("v"), ReplicateConfig{Replicas: 2, MinReplicas: 3}), errcode.ErrInvalidParams)
	require.ErrorIs(t, a.Put(ctx, "bad", []byte("v"), ReplicateConfig{MinReplicas: -1}), errcode.ErrInvalidParams)

	require.NoError(t, a.Put(ctx, "one", []byte("v"), ReplicateConfig{Replicas: 2}))
	st := a.Stats()
	assert.Equal(t, uint64(1), st.StoredReplicas[1])
	assert.Equal(t, uint64(1), st.UnderReplicatedPuts)
	newTestClient(t, tm, 16<<20)
	require.NoError(t, a.Put(ctx, "full", []byte("v"), ReplicateConfig{Replicas: 2, MinReplicas: 2}))
	require.Empty(t, a.BatchPut(ctx, []string{"f1", "f2"}, [][]byte{[]byte("v"), []byte("v")}, ReplicateConfig{Replicas: 2})[0])
	st = a.Stats()
	assert.Equal(t, uint64(3), st.StoredReplicas[2])
	assert.Equal(t, uint64(1), st.UnderReplicatedPuts)
}

// TestPutsSurviveClientKill: two clients, one a separate process killed
// with SIGKILL under load. Every put of the survivor succeeds, long
// before the master's client TTL could expire the dead one: with one
// replica on the live segment, with two asked (MinReplicas 1) on the one
// segment left. Each variant starts its own client process.
func TestPutsSurviveClientKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const n, workers = 400, 4
	for _, tc := range []struct {
		name        string
		rc          ReplicateConfig
		batch, size int // the live segment holds every value
	}{
		{"one replica", ReplicateConfig{}, 1, 32 << 10},
		{"two replicas", ReplicateConfig{Replicas: 2, MinReplicas: 1}, 1, 32 << 10},
		{"batch", ReplicateConfig{Replicas: 2}, 8, 4 << 10},
	} {
		size := tc.size
		t.Run(tc.name, func(t *testing.T) {
			tm := startMaster(t, master.Config{ClientTTL: time.Hour})
			live := newTestClient(t, tm, 64<<20, protocols("tcp"))
			dead := startChild(t, "client", "CRESCENT_CHILD_MASTER="+tm.addr)
			eventually(t, "both segments mounted", func() bool { return len(tm.m.AllSegments()) == 2 })
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			var done atomic.Int64
			killAt := make(chan struct{})
			jobs := make(chan int)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range jobs {
						keys := make([]string, tc.batch)
						vals := make([][]byte, tc.batch)
						for j := range keys {
							keys[j] = fmt.Sprintf("k%d/%d", i, j)
							vals[j] = testutil.Bytes(size, uint64(i*tc.batch+j))
						}
						if tc.batch == 1 {
							errs[i] = live.Put(ctx, keys[0], vals[0], tc.rc)
						} else {
							for _, err := range live.BatchPut(ctx, keys, vals, tc.rc) {
								errs[i] = cmpOr(errs[i], err)
							}
						}
						if done.Add(1) == n/4 {
							close(killAt)
						}
					}
				}()
			}
			go func() {
				defer close(jobs)
				for i := range n {
					select {
					case jobs <- i:
					case <-ctx.Done():
						return
					}
				}
			}()
			<-killAt
			var used uint64
			for _, s := range tm.m.AllSegments() {
				if s.Name == dead.first {
					used = s.Used
				}
			}
			require.Positive(t, used, "nothing was placed on the client to kill: the test proves nothing")
			require.NoError(t, dead.cmd.Process.Kill())
			dead.cmd.Wait()
			wg.Wait()
			for i, err := range errs {
				require.NoError(t, err, "put %d", i)
			}
			require.Equal(t, int64(n), done.Load())
			assert.Equal(t, []string{dead.first}, suspectNames(tm))
			assert.Equal(t, 2, tm.m.Stats().ActiveClients, "the dead client did not expire: placement avoided it")
			st := live.Stats()
			assert.Positive(t, st.FailedSegmentReports)
			if tc.rc.Replicas == 2 {
				assert.Positive(t, st.UnderReplicatedPuts)
				assert.Positive(t, st.StoredReplicas[1])
				// Every key has its replica on the live segment.
				for i := range n {
					for j := range tc.batch {
						got, err := live.Get(ctx, fmt.Sprintf("k%d/%d", i, j))
						require.NoError(t, err)
						require.True(t, bytes.Equal(testutil.Bytes(size, uint64(i*tc.batch+j)), got))
					}
				}
			}
		})
	}
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
