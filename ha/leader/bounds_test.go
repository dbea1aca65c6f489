package leader

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// oversizedView checks one backend against views no coordinator wrote:
// put(v) stores v as the leader address behind the coordinator's back.
func oversizedView(t *testing.T, c Coordinator, put func(string)) {
	ctx := ctxT(t)
	_, _, err := c.TryAcquire(ctx, strings.Repeat("a", MaxAddrLen+1))
	require.ErrorIs(t, err, ErrInvalid)

	put(strings.Repeat("b", MaxAddrLen+1))
	_, err = c.View(ctx)
	require.ErrorIs(t, err, ErrBadView)
	_, _, err = c.TryAcquire(ctx, "a:1")
	require.ErrorIs(t, err, ErrBadView)

	// A waiter does not take the bad view as a change; it takes the next
	// good one.
	got := make(chan View, 1)
	go func() {
		v, err := c.WaitChange(ctx, 0)
		if err == nil {
			got <- v
		}
		close(got)
	}()
	select {
	case v := <-got:
		t.Fatalf("WaitChange returned a bad view of %d bytes", len(v.Leader))
	case <-time.After(300 * time.Millisecond):
	}
	put("c:3")
	v, ok := <-got
	require.True(t, ok)
	require.Equal(t, "c:3", v.Leader)
}

func TestEtcdOversizedView(t *testing.T) {
	e := testsvc.StartEtcd(t)
	cli := etcdClient(t, e.Endpoint)
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}})
	require.NoError(t, err)
	defer raw.Close()
	c, err := NewEtcd(cli, "big", WithTTL(etcdTTL))
	require.NoError(t, err)
	defer c.Close()
	key := EtcdKey("crescent", "big")
	put := func(v string) {
		_, err := raw.Put(context.Background(), key, v)
		require.NoError(t, err)
	}
	oversizedView(t, c, put)

	// A value past the client's receive bound is refused from its length,
	// not read whole.
	put(strings.Repeat("d", etcdMaxRecv+etcdMaxRecv/4))
	_, err = c.View(ctxT(t))
	require.ErrorContains(t, err, "received message larger than max")
}

func TestRedisOversizedView(t *testing.T) {
	r := testsvc.StartRedis(t)
	cli := redisClient(t, r.Addr)
	c, err := NewRedis(cli, "big", WithTTL(redisTTL), WithPollInterval(20*time.Millisecond))
	require.NoError(t, err)
	defer c.Close()
	view, _ := RedisKeys("crescent", "big")
	version := 0
	oversizedView(t, c, func(v string) {
		version++
		require.NoError(t, cli.HSet(context.Background(), view, "leader_address", v, "view_version", version).Err())
	})
	// A megabyte in either field is cut short by the server: the reply a
	// reader takes stays small.
	ctx := ctxT(t)
	for _, field := range []string{"leader_address", "view_version"} {
		require.NoError(t, cli.HSet(ctx, view, "leader_address", "c:3", "view_version", 1).Err())
		require.NoError(t, cli.HSet(ctx, view, field, strings.Repeat("9", 1<<20)).Err())
		before := r.BytesSent(t)
		_, err = c.View(ctx)
		require.ErrorIs(t, err, ErrBadView, field)
		_, _, err = c.TryAcquire(ctx, "a:1")
		require.ErrorIs(t, err, ErrBadView, field)
		require.Less(t, r.BytesSent(t)-before, int64(64<<10), "%s: bytes sent", field)
	}
}
