package leader

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/internal/redisproc"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

const redisTTL = time.Second

func redisClient(t *testing.T, addr string) *redis.Client {
	cli := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { cli.Close() })
	return cli
}

func redisHarness(cli *redis.Client) harness {
	return harness{
		ttl: redisTTL,
		newCoord: func(t *testing.T, id string) Coordinator {
			c, err := NewRedis(cli, id, WithTTL(redisTTL), WithPollInterval(20*time.Millisecond))
			require.NoError(t, err)
			return c
		},
		steal: func(t *testing.T, s Session) {
			rs := s.(*redisSession)
			require.NoError(t, cli.HSet(context.Background(), rs.c.view, "owner_token", "someone-else").Err())
		},
	}
}

func TestRedisContract(t *testing.T) {
	r := testsvc.StartRedis(t)
	runContract(t, redisHarness(redisClient(t, r.Addr)))
}

func TestRedisLayout(t *testing.T) {
	r := testsvc.StartRedis(t)
	cli := redisClient(t, r.Addr)
	c, err := NewRedis(cli, "lay", WithTTL(redisTTL), WithPrefix("p"))
	require.NoError(t, err)
	defer c.Close()
	ctx := ctxT(t)
	s, v, err := c.TryAcquire(ctx, "a:1")
	require.NoError(t, err)
	view, term := RedisKeys("p", "lay")
	require.Equal(t, "{p:lay}:master_view", view)
	require.Equal(t, "{p:lay}:term", term)
	h, err := cli.HGetAll(ctx, view).Result()
	require.NoError(t, err)
	require.Equal(t, "a:1", h["leader_address"])
	require.Equal(t, "1", h["view_version"])
	require.Len(t, h["owner_token"], 32)
	require.Len(t, h, 3)
	require.Equal(t, "1", cli.Get(ctx, term).Val())
	pttl := cli.PTTL(ctx, view).Val()
	require.True(t, pttl > 0 && pttl <= redisTTL, "pttl %v", pttl)
	require.Equal(t, uint64(1), v.Version)
	// Deleting the hash (as an expiry would) ends the session at the next renewal.
	require.NoError(t, cli.Del(ctx, view).Err())
	require.ErrorIs(t, s.Renew(ctx), ErrLeadershipLost)
	require.ErrorIs(t, s.Err(), ErrLeadershipLost)
}

func TestRedisBadConfig(t *testing.T) {
	cli := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer cli.Close()
	for _, opts := range [][]Option{
		{WithTTL(500 * time.Millisecond)}, {WithPollInterval(0)}, {WithMinTerm(1 << 53)}, {WithPrefix("a{b")},
	} {
		_, err := NewRedis(cli, "x", opts...)
		require.ErrorIs(t, err, ErrInvalid)
	}
	_, err := NewRedis(cli, "")
	require.ErrorIs(t, err, ErrInvalid)
	_, err = NewRedis(nil, "x")
	require.ErrorIs(t, err, ErrInvalid)
}

func TestRedisMinTerm(t *testing.T) {
	r := testsvc.StartRedis(t)
	cli := redisClient(t, r.Addr)
	c, err := NewRedis(cli, "min", WithTTL(redisTTL), WithMinTerm(41))
	require.NoError(t, err)
	defer c.Close()
	ctx := ctxT(t)
	s, v, err := c.TryAcquire(ctx, "a:1")
	require.NoError(t, err)
	require.Equal(t, uint64(42), v.Version)
	require.NoError(t, s.Release(ctx))
	s, v, err = c.TryAcquire(ctx, "a:1")
	require.NoError(t, err)
	require.Equal(t, uint64(43), v.Version)
	require.NoError(t, s.Release(ctx))
}

// TestRedisRestartDataLoss restarts redis-server without persistence:
// the session ends, the term counter starts over, and WithMinTerm
// seeded with the old term keeps the next term above it.
func TestRedisRestartDataLoss(t *testing.T) {
	srv, err := redisproc.Start("")
	if err != nil {
		testsvc.MissingDep(t, "redis-server", err)
	}
	defer func() { srv.Close() }()
	var addr atomic.Value
	addr.Store(srv.Addr)
	// One logical endpoint whose server is replaced, as a restart would.
	cli := redis.NewClient(&redis.Options{Addr: "redis", MaxRetries: -1,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr.Load().(string))
		}})
	defer cli.Close()
	c, err := NewRedis(cli, "rs", WithTTL(redisTTL))
	require.NoError(t, err)
	defer c.Close()
	ctx := ctxT(t)
	var old uint64
	for range 3 {
		s, v, err := c.TryAcquire(ctx, "a:1")
		require.NoError(t, err)
		old = v.Version
		require.NoError(t, s.Release(ctx))
	}
	s, v, err := c.TryAcquire(ctx, "a:1")
	require.NoError(t, err)
	old = v.Version
	fired := make(chan error, 1)
	Monitor(s, func(r error) { fired <- r })

	srv.Close()
	srv, err = redisproc.Start("")
	require.NoError(t, err)
	addr.Store(srv.Addr)

	require.Eventually(t, func() bool { return isClosed(s.Lost()) }, 4*redisTTL, 20*time.Millisecond)
	reason := <-fired
	require.True(t, errorIsAny(reason, ErrLeadershipLost, ErrRenew), "reason %v", reason)

	// Without a seed the counter restarted: the hazard doc.go describes.
	s2, v2, err := c.TryAcquire(ctx, "b:2")
	require.NoError(t, err)
	require.LessOrEqual(t, v2.Version, old)
	require.NoError(t, s2.Release(ctx))

	seeded, err := NewRedis(cli, "rs", WithTTL(redisTTL), WithMinTerm(old))
	require.NoError(t, err)
	defer seeded.Close()
	s3, v3, err := seeded.TryAcquire(ctx, "b:2")
	require.NoError(t, err)
	require.Greater(t, v3.Version, old)
	require.NoError(t, s3.Release(ctx))
}

func errorIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// TestRedisStopEndsAtDeadline: with Redis gone the session ends with
// ErrRenew at its own deadline, without an answer from Redis.
func TestRedisStopEndsAtDeadline(t *testing.T) {
	srv := testsvc.StartRedis(t)
	cli := redisClient(t, srv.Addr)
	c, err := NewRedis(cli, "stop", WithTTL(redisTTL))
	require.NoError(t, err)
	defer c.Close()
	s, _, err := c.TryAcquire(ctxT(t), "a:1")
	require.NoError(t, err)
	srv.Stop()
	require.Eventually(t, func() bool { return isClosed(s.Lost()) }, 5*redisTTL, 20*time.Millisecond)
	require.ErrorIs(t, s.Err(), ErrRenew)
	require.False(t, time.Now().Before(s.Deadline()), "lost before the deadline %v", s.Deadline())
}
