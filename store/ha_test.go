package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
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
	// open makes another coordinator on the same backend (another
	// candidate), closed at the end of the test.
	open func(t *testing.T) leader.Coordinator
}

func startElection(t *testing.T, backend string, opts ...leader.Option) *election {
	t.Helper()
	el := &election{}
	switch backend {
	case "etcd":
		e := testsvc.StartEtcd(t)
		cli, err := clientv3.New(leader.EtcdClientConfig([]string{e.Endpoint}))
		require.NoError(t, err)
		t.Cleanup(func() { cli.Close() })
		el.addr = e.URL()
		el.open = func(t *testing.T) leader.Coordinator {
			co, err := leader.NewEtcd(cli, store.DefaultClusterID, opts...)
			require.NoError(t, err)
			t.Cleanup(func() { co.Close() })
			return co
		}
	case "redis":
		r := testsvc.StartRedis(t)
		cli := redis.NewClient(&redis.Options{Addr: r.Addr})
		t.Cleanup(func() { cli.Close() })
		el.addr, el.rdb = r.URL(), cli
		el.open = func(t *testing.T) leader.Coordinator {
			co, err := leader.NewRedis(cli, store.DefaultClusterID, opts...)
			require.NoError(t, err)
			t.Cleanup(func() { co.Close() })
			return co
		}
	default:
		t.Fatalf("backend %q", backend)
	}
	el.co = el.open(t)
	return el
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
	// A put with no leader waits for one (its request is never sent)
	// within its context, then fails: it neither hangs nor succeeds.
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	t0 := time.Now()
	require.Error(t, c.Put(pctx, "lost", v1, rc), "a put with no leader must fail, not hang or succeed")
	// Not a speed figure: the RPC timeout is 10 s, and the put used to
	// wait for it past its own context (crpc, a coalesced PutStart).
	require.Less(t, time.Since(t0), 5*time.Second, "the put outlived its context")
	cancel()

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

// TestHALeaseExpiry: the leader dies without giving the view up (its
// coordinator closes: the lease is left to expire, as after kill -9), so
// for up to a TTL the view still names it and the client's calls fail;
// once the lease is gone another master acquires, and the client follows
// it, re-mounts and works there.
func TestHALeaseExpiry(t *testing.T) {
	for _, backend := range []string{"etcd", "redis"} {
		t.Run(backend, func(t *testing.T) {
			ctx := testCtx(t)
			el := startElection(t, backend, leader.WithTTL(time.Second))
			ma := store.StartTestMaster(t, master.Config{})
			mb := store.StartTestMaster(t, master.Config{})
			coA := el.open(t)
			sa, va, err := coA.TryAcquire(ctx, ma.Addr())
			require.NoError(t, err)
			require.NotNil(t, sa)
			c := haClient(t, ctx, el.addr, "crpc", 16<<20)
			rc := store.ReplicateConfig{}
			require.NoError(t, c.Put(ctx, "on-a", value(4096, 1), rc))

			ma.Stop()
			require.NoError(t, coA.Close()) // the view stays until the lease expires
			require.ErrorIs(t, sa.Err(), leader.ErrClosed)
			var vb store.LeaderView
			require.Eventually(t, func() bool {
				s, v, err := el.co.TryAcquire(ctx, mb.Addr())
				if err != nil || s == nil {
					return false
				}
				t.Cleanup(func() { s.Release(context.Background()) })
				vb = store.LeaderView{Leader: v.Leader, Version: v.Version}
				return true
			}, 30*time.Second, 50*time.Millisecond)
			require.Greater(t, vb.Version, va.Version)

			require.Eventually(t, func() bool { return c.Leader() == vb && mountedOn(mb.Master(), c.SegmentName()) },
				30*time.Second, 10*time.Millisecond)
			v := value(4096, 2)
			require.NoError(t, c.Put(ctx, "on-b", v, rc))
			got, err := c.Get(ctx, "on-b")
			require.NoError(t, err)
			require.True(t, bytes.Equal(v, got))
			assert.Equal(t, uint64(1), c.Stats().LeaderSwitches)
		})
	}
}

// TestHAFailoverUnderLoad: puts and gets run while the leader stops and
// another takes over. No call hangs past its context, every get that
// succeeds returns the bytes put under its key, and once the client has
// switched its puts succeed on the new leader.
func TestHAFailoverUnderLoad(t *testing.T) {
	ctx := testCtx(t)
	el := startElection(t, "etcd")
	ma := store.StartTestMaster(t, master.Config{})
	mb := store.StartTestMaster(t, master.Config{})
	sa, _ := el.acquire(t, ctx, ma.Addr())
	c := haClient(t, ctx, el.addr, "crpc", 32<<20)

	const workers = 4
	var afterSwitch [workers]atomic.Int64 // puts acknowledged by the new leader
	var vb atomic.Pointer[store.LeaderView]
	stop := make(chan struct{})
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				k, v := fmt.Sprintf("w%d/%d", w, i), value(8<<10, byte(w*31+i))
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				want := vb.Load()
				err := c.Put(cctx, k, v, store.ReplicateConfig{})
				if err == nil {
					got, gerr := c.Get(cctx, k)
					if gerr == nil && !bytes.Equal(v, got) {
						cancel()
						errs <- fmt.Errorf("get %s: wrong bytes", k)
						return
					}
					if want != nil && c.Leader() == *want {
						afterSwitch[w].Add(1)
					}
				}
				cancel()
			}
		}()
	}
	ma.Stop()
	require.NoError(t, sa.Release(ctx))
	_, v := el.acquire(t, ctx, mb.Addr())
	vb.Store(&v)
	require.Eventually(t, func() bool {
		for w := range workers {
			if afterSwitch[w].Load() < 20 {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond)
	close(stop)
	for range workers {
		require.NoError(t, <-errs)
	}
	assert.Equal(t, v, c.Leader())
	assert.Equal(t, uint64(1), c.Stats().LeaderSwitches)
}

// TestHANewWaitsForLeader: New with nobody leading waits for a leader
// within its context, and fails clearly when none comes.
func TestHANewWaitsForLeader(t *testing.T) {
	ctx := testCtx(t)
	el := startElection(t, "etcd")
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := store.New(short, store.Config{MasterAddr: el.addr, LocalHostname: "127.0.0.1", LocalBufferSize: 16 << 20, Logger: store.QuietLogger})
	cancel()
	require.ErrorContains(t, err, "no master leader")

	ma := store.StartTestMaster(t, master.Config{})
	made := make(chan *store.Client, 1)
	go func() {
		c, err := store.New(ctx, store.Config{MasterAddr: el.addr, LocalHostname: "127.0.0.1", LocalBufferSize: 16 << 20, Logger: store.QuietLogger})
		assert.NoError(t, err)
		made <- c
	}()
	_, va := el.acquire(t, ctx, ma.Addr())
	c := <-made
	require.NotNil(t, c)
	defer c.Close()
	assert.Equal(t, va, c.Leader())
	require.NoError(t, c.Ready(ctx))
}

// TestHAPutWaitsForNextLeader: under crpc a put made while nobody serves
// is never sent (no connection can be made), so the client sends it again
// and it succeeds on the next leader, within its context, instead of
// failing the caller.
func TestHAPutWaitsForNextLeader(t *testing.T) {
	ctx := testCtx(t)
	el := startElection(t, "etcd")
	ma := store.StartTestMaster(t, master.Config{})
	mb := store.StartTestMaster(t, master.Config{})
	sa, _ := el.acquire(t, ctx, ma.Addr())
	c := haClient(t, ctx, el.addr, "crpc", 16<<20)
	rc := store.ReplicateConfig{}
	require.NoError(t, c.Put(ctx, "before", value(4096, 1), rc))
	// The next leader has room before c re-mounts there (a durable
	// master would know c's segment from the log).
	holder := haClient(t, ctx, mb.Addr(), "crpc", 16<<20)
	_ = holder

	ma.Stop()
	require.NoError(t, sa.Release(ctx))
	putErr := make(chan error, 1)
	retries := c.Stats().LeaderRetries
	go func() { putErr <- c.Put(ctx, "during", value(4096, 2), rc) }()
	require.Eventually(t, func() bool { return c.Stats().LeaderRetries > retries }, 30*time.Second, 10*time.Millisecond)
	select {
	case err := <-putErr:
		t.Fatalf("the put ended with nobody serving: %v", err)
	default:
	}
	el.acquire(t, ctx, mb.Addr())
	require.NoError(t, <-putErr)
	got, err := c.Get(ctx, "during")
	require.NoError(t, err)
	assert.Equal(t, value(4096, 2), got)
}

// TestHACallsBoundedByRPCTimeout: an HA client on crpc bounds its calls
// by RPCTimeout without a context per call, retries included: with the
// leader gone and nobody taking over, a put and an idempotent call made
// with no deadline of their own end (RPC_FAIL or RPC_TIMEOUT) instead of
// waiting for a leader forever.
func TestHACallsBoundedByRPCTimeout(t *testing.T) {
	ctx := testCtx(t)
	el := startElection(t, "etcd")
	ma := store.StartTestMaster(t, master.Config{})
	sa, _ := el.acquire(t, ctx, ma.Addr())
	c, err := store.New(ctx, store.Config{
		MasterAddr: el.addr, MasterProtocol: "crpc", LocalHostname: "127.0.0.1", GlobalSegmentSize: 16 << 20,
		LocalBufferSize: 16 << 20, HeartbeatInterval: 50 * time.Millisecond, RPCTimeout: 500 * time.Millisecond,
		Logger: store.QuietLogger,
	})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Put(ctx, "before", value(4096, 1), store.ReplicateConfig{}))
	assert.True(t, c.SelfTimed(), "settled on crpc, the HA connection bounds its calls")

	ma.Stop()
	require.NoError(t, sa.Release(ctx))
	for name, call := range map[string]func() error{
		"put":   func() error { return c.Put(context.Background(), "during", value(4096, 2), store.ReplicateConfig{}) },
		"exist": func() error { _, err := c.IsExist(context.Background(), "before"); return err },
	} {
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			assert.Error(t, err, name)
			assert.True(t, errors.Is(err, errcode.ErrRPCFail) || errors.Is(err, errcode.ErrRPCTimeout), "%s: %v", name, err)
		case <-time.After(30 * time.Second): // a hang detector, not a measure
			t.Fatalf("%s with nobody leading did not end", name)
		}
	}
}
