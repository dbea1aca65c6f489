package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine/metadata/redismeta"
	"github.com/crescent-kv/crescent/internal/testsvc"
)

// redisClient connects to s the way a master does: the connection string
// through redismeta.ParseConn.
func redisClient(t *testing.T, s *testsvc.Redis, edit ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o, err := redismeta.ParseConn(s.URL())
	require.NoError(t, err)
	for _, f := range edit {
		f(o)
	}
	cli := redis.NewClient(o)
	t.Cleanup(func() { cli.Close() })
	return cli
}

var clusters atomic.Int64

// newRedisCatalog is a catalog of a cluster id no other test uses.
func newRedisCatalog(t *testing.T, cli redis.UniversalClient) *RedisCatalog {
	c := NewRedisCatalog(cli, "crescent:", fmt.Sprintf("test-%d", clusters.Add(1)))
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRedisCatalogContract(t *testing.T) {
	noLeaks(t)
	s := testsvc.StartRedis(t)
	cli := redisClient(t, s)
	catalogContract(t, func(t *testing.T) Catalog { return newRedisCatalog(t, cli) })
}

func TestRedisCatalogKeysShareASlot(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	s := testsvc.StartRedis(t)
	cli := redisClient(t, s)
	c := NewRedisCatalog(cli, "p:", "c1")
	z, l, h := c.Keys()
	assert.Equal(t, []string{"p:{c1}:snapshots", "p:{c1}:latest", "p:{c1}:metas"}, []string{z, l, h})
	require.NoError(t, c.Publish(ctx, testMeta(4, 2)))
	require.NoError(t, c.Publish(ctx, testMeta(3, 2)))
	zs, err := cli.ZRangeWithScores(ctx, z, 0, -1).Result()
	require.NoError(t, err)
	assert.Equal(t, []redis.Z{{Score: 3, Member: IDFor(3, 2)}, {Score: 4, Member: IDFor(4, 2)}}, zs)
	assert.Equal(t, IDFor(4, 2), cli.Get(ctx, l).Val())
	assert.Equal(t, string(encodeMeta(testMeta(3, 2))), cli.HGet(ctx, h, IDFor(3, 2)).Val())
	keys, err := cli.Keys(ctx, "*").Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{z, l, h}, keys)

	// Another cluster id is another catalog.
	d := NewRedisCatalog(cli, "p:", "c2")
	_, err = d.Latest(ctx)
	require.ErrorIs(t, err, ErrNoSnapshot)
}

func TestRedisCatalogRefusesBadConfig(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	cli := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer cli.Close()
	for _, c := range []*RedisCatalog{
		NewRedisCatalog(nil, "p:", "c"),
		NewRedisCatalog(cli, "p:", ""),
		NewRedisCatalog(cli, "p{x}:", "c"),
		NewRedisCatalog(cli, "p:", "c}"),
	} {
		require.Error(t, c.Publish(ctx, testMeta(1, 1)))
		_, err := c.Latest(ctx)
		require.Error(t, err)
		assert.False(t, errors.Is(err, ErrNoSnapshot))
		_, err = c.List(ctx)
		require.Error(t, err)
		require.Error(t, c.Delete(ctx, IDFor(1, 1)))
	}
}

// A Redis that cannot be reached is a failure, never "no snapshot": a
// master must not start empty because its catalog is down.
func TestRedisCatalogStoppedServerIsNotNoSnapshot(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	for _, published := range []bool{false, true} {
		t.Run(fmt.Sprint("published=", published), func(t *testing.T) {
			s := testsvc.StartRedis(t)
			// No retries: each call fails at once instead of after backoff.
			cli := redisClient(t, s, func(o *redis.Options) {
				o.MaxRetries = -1
				o.DialerRetries = 1
			})
			c := newRedisCatalog(t, cli)
			if published {
				require.NoError(t, c.Publish(ctx, testMeta(1, 1)))
			}
			_, err := c.Latest(ctx)
			if !published {
				require.ErrorIs(t, err, ErrNoSnapshot, "up and empty")
			} else {
				require.NoError(t, err)
			}
			s.Stop()
			_, err = c.Latest(ctx)
			require.Error(t, err)
			assert.False(t, errors.Is(err, ErrNoSnapshot), "%v", err)
			assert.False(t, errors.Is(err, redis.Nil), "%v", err)
			_, err = c.List(ctx)
			require.Error(t, err)
			require.Error(t, c.Publish(ctx, testMeta(2, 1)))
			require.Error(t, c.Delete(ctx, IDFor(1, 1)))
		})
	}
}

// Damaged or hand-edited keys are ErrCorrupt, never ErrNoSnapshot, and an
// oversized value is refused inside Redis, before it is sent.
func TestRedisCatalogCorruption(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	s := testsvc.StartRedis(t)
	cli := redisClient(t, s)
	big := strings.Repeat("x", maxMetaSize+1)
	for _, c := range []struct {
		name   string
		damage func(z, l, h string)
		list   bool // List still works
	}{
		{"meta garbage", func(z, l, h string) { cli.HSet(ctx, h, IDFor(2, 1), "garbage") }, false},
		{"meta size changed", func(z, l, h string) {
			b := bytes.Replace(encodeMeta(testMeta(2, 1)), []byte(`"size":20`), []byte(`"size":30`), 1)
			cli.HSet(ctx, h, IDFor(2, 1), b)
		}, false},
		{"meta of another id", func(z, l, h string) { cli.HSet(ctx, h, IDFor(2, 1), encodeMeta(testMeta(1, 1))) }, false},
		{"meta huge", func(z, l, h string) { cli.HSet(ctx, h, IDFor(2, 1), big) }, false},
		{"meta missing", func(z, l, h string) { cli.HDel(ctx, h, IDFor(2, 1)) }, false},
		{"latest garbage", func(z, l, h string) { cli.Set(ctx, l, "../x", 0) }, true},
		{"latest huge", func(z, l, h string) { cli.Set(ctx, l, big, 0) }, true},
		{"latest gone, snapshots left", func(z, l, h string) { cli.Del(ctx, l) }, true},
		{"member garbage", func(z, l, h string) {
			cli.ZAdd(ctx, z, redis.Z{Score: 0, Member: "bad"})
			cli.HSet(ctx, h, "bad", encodeMeta(testMeta(1, 1)))
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cat := newRedisCatalog(t, cli)
			require.NoError(t, cat.Publish(ctx, testMeta(1, 1)))
			require.NoError(t, cat.Publish(ctx, testMeta(2, 1)))
			c.damage(cat.Keys())
			_, err := cat.Latest(ctx)
			if c.name != "member garbage" {
				require.ErrorIs(t, err, ErrCorrupt)
				assert.False(t, errors.Is(err, ErrNoSnapshot))
			}
			_, err = cat.List(ctx)
			if c.list {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrCorrupt)
			}
		})
	}
}

// TestRedisCatalogHugeIDNotSent: an id longer than IDFor's, with a meta
// and named by latest, is refused by the scripts without being sent.
func TestRedisCatalogHugeIDNotSent(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	s := testsvc.StartRedis(t)
	cli := redisClient(t, s)
	cat := newRedisCatalog(t, cli)
	require.NoError(t, cat.Publish(ctx, testMeta(1, 1)))
	z, l, h := cat.Keys()
	id := strings.Repeat("9", 1<<20)
	require.NoError(t, cli.ZAdd(ctx, z, redis.Z{Score: 3, Member: id}).Err())
	require.NoError(t, cli.HSet(ctx, h, id, encodeMeta(testMeta(1, 1))).Err())
	require.NoError(t, cli.Set(ctx, l, id, 0).Err())
	before := s.BytesSent(t)
	_, err := cat.Latest(ctx)
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = cat.List(ctx)
	require.ErrorIs(t, err, ErrCorrupt)
	require.Less(t, s.BytesSent(t)-before, int64(64<<10), "bytes sent for Latest and List")
}
