package leader

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// partitionedLeader: a leader whose connection to the store is cut (a
// proxy holds its bytes, so its calls hang rather than fail, as in a
// partition) ends its session with ErrRenew at its own deadline, and a
// contender that still reaches the store takes over only after that
// deadline: the two never both hold a session they believe live.
func partitionedLeader(t *testing.T, cut, direct Coordinator, px *testutil.Proxy, ttl time.Duration) {
	ctx := ctxT(t)
	s, v, err := cut.TryAcquire(ctx, "a:1")
	require.NoError(t, err)
	require.NoError(t, s.Renew(ctx))
	px.Partition(true)

	var won Session
	var at time.Time
	require.Eventually(t, func() bool {
		ns, _, err := direct.TryAcquire(ctx, "b:1")
		require.NoError(t, err)
		if ns == nil { // contended: the cut leader's lease lives
			return false
		}
		won, at = ns, time.Now()
		return true
	}, 10*ttl, 20*time.Millisecond, "the contender never took over")
	require.False(t, at.Before(s.Deadline()), "taken over at %v, before the cut leader's deadline %v", at, s.Deadline())
	// Its deadline has passed: the session ends on its timer, not when a
	// hung renewal gives up (before the fix, Redis's ended at the
	// client's 3 s read timeout, 4 s after its deadline).
	require.Eventually(t, func() bool { return isClosed(s.Lost()) }, ttl, 10*time.Millisecond,
		"the cut leader's session outlived the contender's takeover by a TTL")
	require.ErrorIs(t, s.Err(), ErrRenew)
	nv, err := direct.View(ctx)
	require.NoError(t, err)
	require.Equal(t, "b:1", nv.Leader)
	require.NotEqual(t, v.Version, nv.Version)

	px.Partition(false)
	require.NoError(t, won.Release(ctx))
}

func TestEtcdPartitionedLeader(t *testing.T) {
	e := testsvc.StartEtcd(t)
	px := testutil.NewProxy(t, e.Endpoint)
	cut, err := NewEtcd(etcdClient(t, px.Addr()), "part", WithTTL(etcdTTL))
	require.NoError(t, err)
	defer cut.Close()
	direct, err := NewEtcd(etcdClient(t, e.Endpoint), "part", WithTTL(etcdTTL))
	require.NoError(t, err)
	defer direct.Close()
	partitionedLeader(t, cut, direct, px, etcdTTL)
}

func TestRedisPartitionedLeader(t *testing.T) {
	srv := testsvc.StartRedis(t)
	px := testutil.NewProxy(t, srv.Addr)
	cut, err := NewRedis(redisClient(t, px.Addr()), "part", WithTTL(redisTTL))
	require.NoError(t, err)
	defer cut.Close()
	direct, err := NewRedis(redisClient(t, srv.Addr), "part", WithTTL(redisTTL))
	require.NoError(t, err)
	defer direct.Close()
	partitionedLeader(t, cut, direct, px, redisTTL)
}
