package store_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/crescent-kv/crescent/ha/leader"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/haview"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/storepb"
)

// election is a real coordinator the test campaigns on for the masters
// it starts in-process (the supervisor's part), and the address a client
// is given to follow it.
type election struct {
	co   leader.Coordinator
	addr string        // MasterAddr: etcd://... or redis://...
	rdb  *redis.Client // redis only
}

func startElection(t *testing.T, backend string) *election {
	t.Helper()
	switch backend {
	case "etcd":
		e := testsvc.StartEtcd(t)
		cli, err := clientv3.New(leader.EtcdClientConfig([]string{e.Endpoint}))
		require.NoError(t, err)
		t.Cleanup(func() { cli.Close() })
		co, err := leader.NewEtcd(cli, store.DefaultClusterID)
		require.NoError(t, err)
		t.Cleanup(func() { co.Close() })
		return &election{co: co, addr: e.URL()}
	case "redis":
		r := testsvc.StartRedis(t)
		cli := redis.NewClient(&redis.Options{Addr: r.Addr})
		t.Cleanup(func() { cli.Close() })
		co, err := leader.NewRedis(cli, store.DefaultClusterID)
		require.NoError(t, err)
		t.Cleanup(func() { co.Close() })
		return &election{co: co, addr: r.URL(), rdb: cli}
	}
	t.Fatalf("backend %q", backend)
	return nil
}

func (e *election) acquire(t *testing.T, ctx context.Context, addr string) (leader.Session, store.LeaderView) {
	t.Helper()
	s, v, err := e.co.TryAcquire(ctx, addr)
	require.NoError(t, err)
	require.NotNil(t, s, "contended: %v leads", v)
	t.Cleanup(func() { s.Release(context.Background()) })
	return s, store.LeaderView{Leader: v.Leader, Version: v.Version}
}

func haClient(t *testing.T, ctx context.Context, addr, proto string, seg int64) *store.Client {
	t.Helper()
	c, err := store.New(ctx, store.Config{
		MasterAddr: addr, MasterProtocol: proto, LocalHostname: "127.0.0.1", GlobalSegmentSize: seg,
		LocalBufferSize: 16 << 20, HeartbeatInterval: 50 * time.Millisecond, Logger: store.QuietLogger,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Close()) })
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mountedOn reports whether m holds a segment named name.
func mountedOn(m *master.Master, name string) bool {
	for _, s := range m.AllSegments() {
		if s.Name == name {
			return true
		}
	}
	return false
}

func value(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// TestHAFailover: a client of etcd:// or redis:// follows the leader the
// view names; when it stops and another master takes over, the client
// switches to it, re-mounts its segment there (the new master answers
// NEED_REMOUNT), and puts and gets work on it. A put while nobody leads
// fails; an idempotent call waits for the new leader and is answered
// there. A view older than the current one is ignored.
func TestHAFailover(t *testing.T) {
	for _, backend := range []string{"etcd", "redis"} {
		for _, proto := range []string{"crpc", "grpc", "auto"} {
			t.Run(backend+"/"+proto, func(t *testing.T) { testHAFailover(t, backend, proto) })
		}
	}
}

func testHAFailover(t *testing.T, backend, proto string) {
	ctx := testCtx(t)
	el := startElection(t, backend)
	ma := store.StartTestMaster(t, master.Config{})
	mb := store.StartTestMaster(t, master.Config{})
	sa, va := el.acquire(t, ctx, ma.Addr())

	c := haClient(t, ctx, el.addr, proto, 16<<20)
	require.Equal(t, va, c.Leader())
	rc := store.ReplicateConfig{}
	v1 := value(64<<10, 1)
	// Puts of one size: the client holds put-ahead reservations on the
	// leader, which mean nothing to the next one.
	for i := range 6 {
		require.NoError(t, c.Put(ctx, fmt.Sprintf("ahead/%d", i), value(32<<10, byte(100+i)), rc))
	}
	require.NoError(t, c.Put(ctx, "before", v1, rc))
	got, err := c.Get(ctx, "before")
	require.NoError(t, err)
	require.True(t, bytes.Equal(v1, got))
	assert.Equal(t, settled(proto), c.MasterProtocol())
	assert.True(t, mountedOn(ma.Master(), c.SegmentName()))

	// The leader goes; nobody leads for a while.
	ma.Stop()
	require.NoError(t, sa.Release(ctx))
	require.Error(t, c.Put(ctx, "lost", v1, rc), "a put with no leader must fail, not hang or succeed")

	// An idempotent call in flight waits for the next leader.
	getErr := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "before")
		getErr <- err
	}()
	require.Eventually(t, func() bool { return c.Stats().LeaderRetries > 0 }, 30*time.Second, 10*time.Millisecond)

	_, vb := el.acquire(t, ctx, mb.Addr())
	require.Greater(t, vb.Version, va.Version)
	// Answered by the new leader, which never had the object.
	require.ErrorIs(t, <-getErr, errcode.ErrObjectNotFound)

	require.Eventually(t, func() bool { return c.Leader() == vb }, 30*time.Second, 10*time.Millisecond)
	// Mounted on the master before the client counts the re-mount.
	require.Eventually(t, func() bool { return mountedOn(mb.Master(), c.SegmentName()) && c.Stats().Remounts > 0 },
		30*time.Second, 10*time.Millisecond)
	st := c.Stats()
	assert.Equal(t, uint64(1), st.LeaderSwitches)
	assert.Equal(t, vb.Version, st.LeaderVersion)
	assert.Equal(t, mb.Addr(), st.Leader)

	for i := range 20 {
		k, v := fmt.Sprintf("after/%d", i), value(32<<10, byte(i))
		require.NoError(t, c.Put(ctx, k, v, rc))
		got, err := c.Get(ctx, k)
		require.NoError(t, err)
		require.True(t, bytes.Equal(v, got))
		info, err := mb.Master().QueryKey(k)
		require.NoError(t, err)
		require.Len(t, info.Replicas, 1)
		assert.Equal(t, c.SegmentName(), info.Replicas[0].SegmentName)
	}
	assert.Equal(t, settled(proto), c.MasterProtocol())
	assert.Positive(t, c.Stats().PutsAhead, "no put went ahead: the reservations were not exercised")
	assert.Zero(t, c.Stats().AheadGone, "a put used a reservation of the old leader")

	// A view older than the current one changes nothing.
	switched, err := c.SwitchLeader(ctx, store.LeaderView{Leader: ma.Addr(), Version: vb.Version - 1})
	require.NoError(t, err)
	assert.False(t, switched)
	assert.Equal(t, vb, c.Leader())
	assert.Equal(t, uint64(1), c.Stats().StaleLeaderViews)
	require.NoError(t, c.Ready(ctx))
}

// settled is the protocol a client of proto talks to a master serving both.
func settled(proto string) string {
	if proto == "auto" {
		return "crpc"
	}
	return proto
}

// TestHARedisTermResetIgnored: Redis without persistence loses its term
// counter on a restart, so a new acquisition can carry a lower term than
// the leader the client follows. The client's watch must ignore that view
// and stay on the leader it has.
func TestHARedisTermResetIgnored(t *testing.T) {
	ctx := testCtx(t)
	el := startElection(t, "redis")
	ma := store.StartTestMaster(t, master.Config{})
	mb := store.StartTestMaster(t, master.Config{})
	// Raise the term so that the one after a reset is lower.
	for range 3 {
		s, _, err := el.co.TryAcquire(ctx, ma.Addr())
		require.NoError(t, err)
		require.NotNil(t, s)
		require.NoError(t, s.Release(ctx))
	}
	_, va := el.acquire(t, ctx, ma.Addr())
	c := haClient(t, ctx, el.addr, "crpc", 0)
	require.Equal(t, va, c.Leader())

	view, term := leader.RedisKeys(leader.DefaultPrefix, store.DefaultClusterID)
	require.NoError(t, el.rdb.Del(ctx, view, term).Err()) // what a restart without persistence leaves
	_, vb := el.acquire(t, ctx, mb.Addr())
	require.Less(t, vb.Version, va.Version)

	require.Eventually(t, func() bool { return c.Stats().StaleLeaderViews > 0 }, 30*time.Second, 10*time.Millisecond)
	assert.Equal(t, va, c.Leader())
	assert.Zero(t, c.Stats().LeaderSwitches)
	require.NoError(t, c.Ready(ctx))
}

// TestHAAddress: bad HA addresses are refused with clear errors.
func TestHAAddress(t *testing.T) {
	ctx := testCtx(t)
	for _, tc := range []struct{ addr, want string }{
		{"etcd://", "no etcd endpoint"},
		{"etcd://127.0.0.1", "endpoint"},
		{"redis://:6379", "no host"},
		{"zk://127.0.0.1:2181", `scheme "zk" not registered`},
	} {
		_, err := store.New(ctx, store.Config{MasterAddr: tc.addr, Logger: store.QuietLogger})
		require.ErrorIs(t, err, store.ErrInvalidConfig, tc.addr)
		assert.Contains(t, err.Error(), tc.want, tc.addr)
	}
	_, err := store.New(ctx, store.Config{MasterAddr: "etcd://127.0.0.1:2379", ClusterID: "a/b", Logger: store.QuietLogger})
	require.ErrorIs(t, err, store.ErrInvalidConfig)
	require.ErrorIs(t, err, leader.ErrInvalid)
}

// stuckWatch is a leader source whose watch never reports (as a watch on
// a hung etcd member once did upstream): only reads of the view see
// changes.
type stuckWatch struct{ store.LeaderSource }

func (s stuckWatch) WaitChange(ctx context.Context, _ uint64) (store.LeaderView, error) {
	<-ctx.Done()
	return store.LeaderView{}, ctx.Err()
}

func init() {
	store.RegisterLeaderScheme("stuck-etcd", func(ctx context.Context, addr, clusterID string) (store.LeaderSource, error) {
		src, err := haview.OpenEtcd(ctx, "etcd://"+strings.TrimPrefix(addr, "stuck-etcd://"), clusterID)
		if err != nil {
			return nil, err
		}
		return stuckWatch{src}, nil
	})
}

// TestHAFailedCallsReadView: with a watch that reports nothing, calls
// that fail UNAVAILABLE make the client read the view, find the new
// leader and switch; the idempotent call that found the old one gone is
// answered by the new one.
func TestHAFailedCallsReadView(t *testing.T) {
	ctx := testCtx(t)
	el := startElection(t, "etcd")
	ma := store.StartTestMaster(t, master.Config{})
	mb := store.StartTestMaster(t, master.Config{})
	sa, va := el.acquire(t, ctx, ma.Addr())
	c := haClient(t, ctx, "stuck-"+el.addr, "crpc", 0)
	require.Equal(t, va, c.Leader())
	require.NoError(t, c.Ready(ctx))

	ma.Stop()
	require.NoError(t, sa.Release(ctx))
	_, vb := el.acquire(t, ctx, mb.Addr())
	require.NoError(t, c.Ready(ctx))
	assert.Equal(t, vb, c.Leader())
	assert.Equal(t, uint64(1), c.Stats().LeaderSwitches)
}

// TestHASwitchAwayFromLiveLeader: a leader that loses the view but still
// answers (deposed, not dead) gets no more calls once the client has
// switched: puts land on the new leader and reads are answered by it.
func TestHASwitchAwayFromLiveLeader(t *testing.T) {
	for _, proto := range []string{"crpc", "grpc"} {
		t.Run(proto, func(t *testing.T) {
			ctx := testCtx(t)
			el := startElection(t, "etcd")
			ma := store.StartTestMaster(t, master.Config{})
			mb := store.StartTestMaster(t, master.Config{})
			sa, _ := el.acquire(t, ctx, ma.Addr())
			c := haClient(t, ctx, el.addr, proto, 16<<20)
			rc := store.ReplicateConfig{}
			require.NoError(t, c.Put(ctx, "on-a", value(4096, 1), rc))

			require.NoError(t, sa.Release(ctx)) // ma keeps serving
			_, vb := el.acquire(t, ctx, mb.Addr())
			require.Eventually(t, func() bool { return c.Leader() == vb }, 30*time.Second, 10*time.Millisecond)
			require.Eventually(t, func() bool { return mountedOn(mb.Master(), c.SegmentName()) }, 30*time.Second, 10*time.Millisecond)

			v := value(4096, 2)
			require.NoError(t, c.Put(ctx, "on-b", v, rc))
			_, err := ma.Master().QueryKey("on-b")
			require.ErrorIs(t, err, errcode.ErrObjectNotFound, "the deposed leader took a put")
			got, err := c.Get(ctx, "on-b")
			require.NoError(t, err)
			require.True(t, bytes.Equal(v, got))
			_, err = c.Get(ctx, "on-a")
			require.ErrorIs(t, err, errcode.ErrObjectNotFound, "the deposed leader answered a get")
		})
	}
}

// TestIdempotentMethods: the retried RPCs are the documented ones, and
// each is a method of the master service (a misspelt name would silently
// never be retried).
func TestIdempotentMethods(t *testing.T) {
	want := []string{"BatchExistKey", "BatchGetReplicaList", "ExistKey", "GetReplicaList", "Ping",
		"QuerySegmentStatus", "ReMountSegment", "ReportFailedSegments", "ServiceReady"}
	assert.Equal(t, want, store.IdempotentMethods())
	methods := map[string]bool{}
	for _, m := range storepb.Master_ServiceDesc.Methods {
		methods[m.MethodName] = true
	}
	for _, m := range want {
		assert.True(t, methods[m], m)
	}
}
