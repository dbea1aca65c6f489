package leader

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testsvc.GoleakIgnores()...)
}

// harness is one backend for the contract tests: a fresh coordinator per
// call (a new cluster id on the same server) and a way to take a
// session's lease away behind its back.
type harness struct {
	newCoord func(t *testing.T, clusterID string) Coordinator
	steal    func(t *testing.T, s Session)
	ttl      time.Duration
}

var clusterSeq atomic.Int64

func newCluster(t *testing.T, h harness) Coordinator {
	c := h.newCoord(t, fmt.Sprintf("c%d", clusterSeq.Add(1)))
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func runContract(t *testing.T, h harness) {
	t.Run("AcquireEmpty", func(t *testing.T) {
		c, ctx := newCluster(t, h), ctxT(t)
		v, err := c.View(ctx)
		require.NoError(t, err)
		require.True(t, v.IsZero())
		s, got, err := c.TryAcquire(ctx, "10.0.0.1:50051")
		require.NoError(t, err)
		require.NotNil(t, s)
		assert.Equal(t, "10.0.0.1:50051", got.Leader)
		assert.NotZero(t, got.Version)
		assert.Equal(t, got.Version, s.Term())
		v, err = c.View(ctx)
		require.NoError(t, err)
		assert.Equal(t, got, v)
		assert.False(t, isClosed(s.Lost()))
		require.NoError(t, s.Err())
		require.NoError(t, s.Renew(ctx))
		require.NoError(t, s.Release(ctx))
		require.ErrorIs(t, s.Err(), ErrClosed)
		v, err = c.View(ctx)
		require.NoError(t, err)
		assert.True(t, v.IsZero(), "release leaves %v", v)
	})
	t.Run("Deadline", func(t *testing.T) {
		c, ctx := newCluster(t, h), ctxT(t)
		before := time.Now()
		s, _, err := c.TryAcquire(ctx, "a:1")
		require.NoError(t, err)
		defer s.Release(ctx)
		d0 := s.Deadline()
		// Counted from a send time within the call, by at most the TTL.
		require.True(t, d0.After(before), "deadline %v before the acquisition began (%v)", d0, before)
		require.False(t, d0.After(time.Now().Add(h.ttl)), "deadline %v more than a TTL ahead", d0)
		mid := time.Now()
		require.NoError(t, s.Renew(ctx))
		d1 := s.Deadline()
		require.False(t, d1.Before(d0), "a renewal moved the deadline back")
		require.False(t, d1.Before(mid.Add(h.ttl)), "renewal sent after %v confirmed only until %v", mid, d1)
		require.False(t, d1.After(time.Now().Add(h.ttl)))
	})
	t.Run("BadAddress", func(t *testing.T) {
		c, ctx := newCluster(t, h), ctxT(t)
		s, _, err := c.TryAcquire(ctx, "")
		require.ErrorIs(t, err, ErrInvalid)
		require.Nil(t, s)
	})
	t.Run("Contended", func(t *testing.T) {
		c, ctx := newCluster(t, h), ctxT(t)
		c2 := newCluster2(t, h, c)
		s, v1, err := c.TryAcquire(ctx, "a:1")
		require.NoError(t, err)
		defer s.Release(ctx)
		s2, v2, err := c2.TryAcquire(ctx, "b:2")
		require.NoError(t, err)
		require.Nil(t, s2)
		assert.Equal(t, v1, v2)
	})
	t.Run("ReleaseThenHigher", func(t *testing.T) {
		c, ctx := newCluster(t, h), ctxT(t)
		s, v1, err := c.TryAcquire(ctx, "a:1")
		require.NoError(t, err)
		require.NoError(t, s.Release(ctx))
		s2, v2, err := c.TryAcquire(ctx, "b:2")
		require.NoError(t, err)
		require.NotNil(t, s2)
		defer s2.Release(ctx)
		assert.Greater(t, v2.Version, v1.Version)
		assert.Equal(t, "b:2", v2.Leader)
		// The old session's release cannot touch the new leader's view.
		require.NoError(t, s.Release(ctx))
		v, err := c.View(ctx)
		require.NoError(t, err)
		assert.Equal(t, v2, v)
	})
	t.Run("StolenLeaseLost", func(t *testing.T) {
		c, ctx := newCluster(t, h), ctxT(t)
		s, _, err := c.TryAcquire(ctx, "a:1")
		require.NoError(t, err)
		var calls atomic.Int32
		reasons := make(chan error, 2)
		Monitor(s, func(r error) { calls.Add(1); reasons <- r })
		h.steal(t, s)
		select {
		case <-s.Lost():
		case <-time.After(4 * h.ttl):
			t.Fatal("session not lost after its lease was taken")
		}
		require.ErrorIs(t, s.Err(), ErrLeadershipLost)
		r := <-reasons
		require.ErrorIs(t, r, ErrLeadershipLost)
		require.NoError(t, s.Release(ctx))
		require.ErrorIs(t, s.Err(), ErrLeadershipLost, "release must not change the reason")
		require.ErrorIs(t, s.Renew(ctx), ErrLeadershipLost)
		assert.Equal(t, int32(1), calls.Load())
	})
	t.Run("MonitorOnRelease", func(t *testing.T) {
		c, ctx := newCluster(t, h), ctxT(t)
		s, _, err := c.TryAcquire(ctx, "a:1")
		require.NoError(t, err)
		got := make(chan error, 2)
		Monitor(s, func(r error) { got <- r })
		require.NoError(t, s.Release(ctx))
		require.ErrorIs(t, <-got, ErrClosed)
		require.NoError(t, s.Release(ctx))
		assert.Empty(t, got)
	})
	t.Run("CloseEndsSessions", func(t *testing.T) {
		c, ctx := h.newCoord(t, fmt.Sprintf("c%d", clusterSeq.Add(1))), ctxT(t)
		s, _, err := c.TryAcquire(ctx, "a:1")
		require.NoError(t, err)
		require.NoError(t, c.Close())
		require.True(t, isClosed(s.Lost()))
		require.ErrorIs(t, s.Err(), ErrClosed)
		_, _, err = c.TryAcquire(ctx, "a:1")
		require.ErrorIs(t, err, ErrClosed)
	})
	t.Run("WaitChange", func(t *testing.T) {
		c, ctx := newCluster(t, h), ctxT(t)
		s, v1, err := c.TryAcquire(ctx, "a:1")
		require.NoError(t, err)
		type res struct {
			v   View
			err error
		}
		out := make(chan res, 1)
		go func() {
			v, err := c.WaitChange(ctx, v1.Version)
			out <- res{v, err}
		}()
		// Renewals are not changes.
		require.NoError(t, s.Renew(ctx))
		select {
		case r := <-out:
			t.Fatalf("WaitChange returned %v %v before any change", r.v, r.err)
		case <-time.After(500 * time.Millisecond):
		}
		require.NoError(t, s.Release(ctx))
		r := <-out
		require.NoError(t, r.err)
		assert.True(t, r.v.IsZero(), "after release: %v", r.v)
		// From "no leader" the next acquire wakes it.
		go func() {
			v, err := c.WaitChange(ctx, 0)
			out <- res{v, err}
		}()
		s2, v2, err := c.TryAcquire(ctx, "b:2")
		require.NoError(t, err)
		defer s2.Release(ctx)
		r = <-out
		require.NoError(t, r.err)
		assert.Equal(t, v2, r.v)
		// A stale version returns the current view at once.
		v, err := c.WaitChange(ctx, v1.Version)
		require.NoError(t, err)
		assert.Equal(t, v2, v)
		// Context end.
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err = c.WaitChange(cctx, v2.Version)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
	t.Run("VersionsIncrease", func(t *testing.T) {
		c, ctx := newCluster(t, h), ctxT(t)
		var last uint64
		for i := range 20 {
			s, v, err := c.TryAcquire(ctx, fmt.Sprintf("m%d:1", i))
			require.NoError(t, err)
			require.NotNil(t, s, "cycle %d contended: %v", i, v)
			require.Greater(t, v.Version, last, "cycle %d", i)
			last = v.Version
			require.NoError(t, s.Release(ctx))
		}
	})
	t.Run("ConcurrentCandidates", func(t *testing.T) {
		c, ctx := newCluster(t, h), ctxT(t)
		coords := []Coordinator{c}
		for range 7 {
			coords = append(coords, newCluster2(t, h, c))
		}
		var wg sync.WaitGroup
		sessions := make([]Session, 8)
		views := make([]View, 8)
		errs := make([]error, 8)
		start := make(chan struct{})
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				sessions[i], views[i], errs[i] = coords[i].TryAcquire(ctx, fmt.Sprintf("cand%d:1", i))
			}()
		}
		close(start)
		wg.Wait()
		winners := 0
		var won View
		for i := range 8 {
			require.NoError(t, errs[i])
			if sessions[i] != nil {
				winners++
				won = views[i]
				defer sessions[i].Release(ctx)
			}
		}
		require.Equal(t, 1, winners)
		for i := range 8 {
			if sessions[i] == nil {
				// A loser saw the winner (or, racing the put, no leader yet
				// is impossible: the guard and the read are one transaction).
				assert.Equal(t, won, views[i], "candidate %d", i)
			}
		}
	})
}

// newCluster2 is another coordinator (another process) on the same
// cluster id as c.
func newCluster2(t *testing.T, h harness, c Coordinator) Coordinator {
	var id string
	switch c := c.(type) {
	case *Etcd:
		id = c.clusterID
	case *Redis:
		id = c.clusterID
	}
	c2 := h.newCoord(t, id)
	t.Cleanup(func() { c2.Close() })
	return c2
}
