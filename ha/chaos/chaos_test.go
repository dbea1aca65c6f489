package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/bench"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store"
	_ "github.com/crescent-kv/crescent/store/haview" // etcd:// and redis:// master addresses
)

var masterBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "crescent-chaos-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	masterBin = filepath.Join(dir, "crescent-master")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	build := exec.Command(gobin, "build", "-o", masterBin, "github.com/crescent-kv/crescent/cmd/crescent-master")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: building crescent-master:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const ttl = time.Second

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// cluster starts three HA masters on a 3-member etcd cluster (and Redis
// leadership with backend "redis").
func cluster(t *testing.T, backend string) (*bench.HACluster, *testsvc.EtcdCluster, *testsvc.Redis) {
	t.Helper()
	cfg, ec, rs := services(t, backend)
	return startCluster(t, cfg), ec, rs
}

// services starts the etcd cluster (and the redis-server with backend
// "redis") and returns the masters' configuration for them.
func services(t *testing.T, backend string) (bench.HAClusterConfig, *testsvc.EtcdCluster, *testsvc.Redis) {
	ec := testsvc.StartEtcdCluster(t, 3)
	cfg := bench.HAClusterConfig{MasterBin: masterBin, Backend: backend, Etcd: ec.Endpoints, LeaseTTL: ttl, Dir: t.TempDir(),
		Args: []string{"--log_level", "debug"}}
	var rs *testsvc.Redis
	if backend == "redis" {
		rs = testsvc.StartRedis(t)
		cfg.Redis = rs.Addr
	}
	return cfg, ec, rs
}

// startCluster starts the masters; a failed test prints their logs.
func startCluster(t *testing.T, cfg bench.HAClusterConfig) *bench.HACluster {
	t.Helper()
	cl, err := bench.StartHACluster(ctxT(t, time.Minute), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			for i := range cl.Masters {
				t.Logf("master %d log:\n%s", i, cl.Log(i))
			}
		}
		cl.Close()
	})
	return cl
}

// client is a store client with a segment on the cluster's HA address.
func client(t *testing.T, cl *bench.HACluster) *store.Client {
	t.Helper()
	c, err := store.New(ctxT(t, 30*time.Second), store.Config{MasterAddr: cl.ClientAddr(), ClusterID: cl.ClusterID(),
		GlobalSegmentSize: 64 << 20, LocalBufferSize: 16 << 20, Protocols: []string{"tcp"},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// verify stops the load and reads back every acknowledged put.
func verify(t *testing.T, c *store.Client, load *bench.HALoad, size int) {
	t.Helper()
	load.Stop()
	acked := load.Acked()
	require.NotEmpty(t, acked)
	lost, err := bench.VerifyAcked(ctxT(t, time.Minute), c, acked, size)
	require.NoError(t, err)
	assert.Empty(t, lost, "acknowledged puts lost (of %d)", len(acked))
	gets, getErrs, bad, badKey := load.Reads()
	assert.Zero(t, bad, "gets returned other bytes than acknowledged (last: %s)", badKey)
	assert.Positive(t, gets, "the readers read nothing")
	t.Logf("%d gets with the right bytes, %d failed", gets, getErrs)
	t.Logf("%d puts acknowledged, %d failed (last: %v), %d lost", len(acked), load.Failed(), load.LastErr(), len(lost))
}

// killLeader kills the leader with SIGKILL, waits for the first put
// acknowledged after, checks the new term and restarts the killed one.
func killLeader(t *testing.T, cl *bench.HACluster, load *bench.HALoad) time.Duration {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	leader, role, err := cl.WaitLeader(ctx, -1)
	require.NoError(t, err)
	t0 := time.Now()
	require.NoError(t, cl.Kill(leader))
	_, d := takenOver(t, ctx, cl, load, leader, role, t0)
	require.NoError(t, cl.Start(leader))
	_, err = cl.WaitRole(ctx, leader, "standby")
	require.NoError(t, err)
	return d
}

// takenOver waits for a put acknowledged after t0 and a leader other
// than old, with a higher term than old's role; it returns that leader
// and how long after t0 the put was acknowledged.
func takenOver(t *testing.T, ctx context.Context, cl *bench.HACluster, load *bench.HALoad, old int, role bench.HARole, t0 time.Time) (int, time.Duration) {
	t.Helper()
	d, err := load.WaitAckAfter(ctx, t0)
	require.NoError(t, err)
	next, nrole, err := cl.WaitLeader(ctx, old)
	require.NoError(t, err)
	require.NotEqual(t, old, next)
	require.Greater(t, nrole.Term, role.Term, "a new leader takes a higher term")
	return next, d
}

func waitServing(t *testing.T, load *bench.HALoad) {
	t.Helper()
	_, err := load.WaitAckAfter(ctxT(t, time.Minute), time.Now())
	require.NoError(t, err)
}

// TestKillLeaderRepeatedly: kill -9 the leader ten times under load;
// nothing acknowledged is lost.
func TestKillLeaderRepeatedly(t *testing.T) {
	cl, _, _ := cluster(t, "etcd")
	c := client(t, cl)
	load := bench.StartHALoad(c, bench.HALoadConfig{Rate: 200, ValueSize: 4096})
	for k := range 10 {
		waitServing(t, load)
		d := killLeader(t, cl, load)
		t.Logf("kill %d: failover %.2f s (lease %v), %d acked, %d failed (last: %v)", k+1, d.Seconds(), ttl, len(load.Acked()), load.Failed(), load.LastErr())
	}
	waitServing(t, load)
	verify(t, c, load, 4096)
}

// TestKillLeaderRedis: the same with leadership on Redis.
func TestKillLeaderRedis(t *testing.T) {
	cl, _, _ := cluster(t, "redis")
	c := client(t, cl)
	load := bench.StartHALoad(c, bench.HALoadConfig{Rate: 200, ValueSize: 4096})
	for k := range 3 {
		waitServing(t, load)
		d := killLeader(t, cl, load)
		t.Logf("kill %d: failover %.2f s (lease %v)", k+1, d.Seconds(), ttl)
	}
	waitServing(t, load)
	verify(t, c, load, 4096)
}

// direct is a store client bound to master i's own address (no HA): it
// keeps talking to that master whatever the view says.
func direct(t *testing.T, ctx context.Context, cl *bench.HACluster, i int) *store.Client {
	t.Helper()
	c, err := store.New(ctx, store.Config{MasterAddr: cl.Masters[i].RPCAddr, GlobalSegmentSize: 16 << 20,
		LocalBufferSize: 16 << 20, Protocols: []string{"tcp"}, RPCTimeout: 2 * time.Second, PutRetries: -1,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// directPuts puts n keys under prefix through c, each within timeout,
// and returns how many were acknowledged (recorded in load: they must
// then be durable).
func directPuts(ctx context.Context, c *store.Client, load *bench.HALoad, prefix string, n int, timeout time.Duration) int {
	acked := 0
	for i := range n {
		key := fmt.Sprintf("%s/%d", prefix, i)
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := c.Put(pctx, key, bench.HAValue(key, 4096), store.ReplicateConfig{})
		cancel()
		if err == nil {
			acked++
			load.Record(bench.HAAck{Key: key})
		}
	}
	return acked
}

// TestStoppedLeaderAcknowledgesNothing: SIGSTOP the leader past its
// lease; a standby takes over; after SIGCONT the old leader acknowledges
// no put from a client still connected to it, and goes back to standby.
func TestStoppedLeaderAcknowledgesNothing(t *testing.T) {
	cl, _, _ := cluster(t, "etcd")
	c := client(t, cl)
	ctx := ctxT(t, 2*time.Minute)
	leader, role, err := cl.WaitLeader(ctx, -1)
	require.NoError(t, err)
	dc := direct(t, ctx, cl, leader) // keeps talking to the old leader after the failover
	load := bench.StartHALoad(c, bench.HALoadConfig{Rate: 200, ValueSize: 4096})
	waitServing(t, load)
	require.NoError(t, dc.Put(ctx, "direct/before", bench.HAValue("direct/before", 4096), store.ReplicateConfig{}))
	load.Record(bench.HAAck{Key: "direct/before"})

	require.NoError(t, cl.Signal(leader, syscall.SIGSTOP))
	t0 := time.Now()
	next, d := takenOver(t, ctx, cl, load, leader, role, t0)
	t.Logf("leader %d stopped, leader %d serving after %.2f s", leader, next, d.Seconds())
	time.Sleep(ttl) // well past the old lease, still stopped
	require.NoError(t, cl.Signal(leader, syscall.SIGCONT))

	assert.Zero(t, directPuts(ctx, dc, load, "direct/after", 20, 3*time.Second), "the deposed leader acknowledged puts after SIGCONT")
	_, err = cl.WaitRole(ctx, leader, "standby")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, err := cl.Role(ctx, leader)
		return err == nil && r.Leader == cl.Masters[next].RPCAddr
	}, time.Minute, 20*time.Millisecond, "the old leader sees the new one")
	waitServing(t, load)
	verify(t, c, load, 4096)
}

// TestEtcdMemberStopped: the etcd cluster's leader member stops under
// load; the masters go on (two of three members are a quorum).
func TestEtcdMemberStopped(t *testing.T) {
	cl, ec, _ := cluster(t, "etcd")
	c := client(t, cl)
	load := bench.StartHALoad(c, bench.HALoadConfig{Rate: 200, ValueSize: 4096})
	waitServing(t, load)
	m := ec.Leader()
	require.GreaterOrEqual(t, m, 0)
	ec.Stop(m)
	t0 := time.Now()
	d, err := load.WaitAckAfter(ctxT(t, time.Minute), t0)
	require.NoError(t, err)
	t.Logf("etcd member %d stopped: puts acknowledged again after %.2f s", m, d.Seconds())
	time.Sleep(2 * ttl) // keep the load up on two members
	waitServing(t, load)
	_, _, err = cl.WaitLeader(ctxT(t, time.Minute), -1)
	require.NoError(t, err)
	verify(t, c, load, 4096)
}

// TestRedisRestarted: Redis (leadership) restarts empty under load; a
// master leads again with a term above the one before (the log's term
// seeds it), and nothing acknowledged is lost.
func TestRedisRestarted(t *testing.T) {
	cl, _, rs := cluster(t, "redis")
	c := client(t, cl)
	load := bench.StartHALoad(c, bench.HALoadConfig{Rate: 200, ValueSize: 4096})
	waitServing(t, load)
	ctx := ctxT(t, 2*time.Minute)
	_, role, err := cl.WaitLeader(ctx, -1)
	require.NoError(t, err)
	require.NoError(t, rs.Restart())
	t0 := time.Now()
	d, err := load.WaitAckAfter(ctx, t0)
	require.NoError(t, err)
	// The view is gone with Redis's data: the leader's next renewal finds
	// it so and it steps down; the election after must take a term above
	// the log's (seeded from it) or its claim of the log would be fenced.
	require.Eventually(t, func() bool {
		_, r, err := cl.WaitLeader(ctx, -1)
		return err == nil && r.Term > role.Term
	}, time.Minute, 50*time.Millisecond)
	t.Logf("redis restarted: puts acknowledged again after %.2f s", d.Seconds())
	waitServing(t, load)
	verify(t, c, load, 4096)
}

// TestRunHA: crescent-bench ha's run (bench.RunHA) on Redis leadership,
// two kills: its result adds up.
func TestRunHA(t *testing.T) {
	res, err := bench.RunHA(ctxT(t, 3*time.Minute), bench.HAConfig{Backend: "redis", Kills: 2, LeaseTTL: ttl,
		MasterBin: masterBin, Settle: 200 * time.Millisecond, SegmentSize: 64 << 20})
	require.NoError(t, err)
	t.Logf("%+v", res)
	assert.Equal(t, "redis", res.Backend)
	assert.Equal(t, 2, res.Kills)
	require.Len(t, res.FailoversS, 2)
	assert.Zero(t, res.LostAcks)
	assert.Positive(t, res.AckedPuts)
	assert.LessOrEqual(t, res.FailoverSMin, res.FailoverSMed)
	assert.LessOrEqual(t, res.FailoverSMed, res.FailoverSMax)
	require.Len(t, res.TermsSeen, 2)
	assert.Less(t, res.TermsSeen[0], res.TermsSeen[1], "each kill's leader has a higher term")
	assert.Equal(t, 1.0, res.LeaseTTLS)
}

// partitionable is cluster with every master reaching etcd and Redis
// through proxies of its own: px[i] cuts master i off from both.
func partitionable(t *testing.T, backend string) (*bench.HACluster, [][]*testutil.Proxy) {
	t.Helper()
	cfg, ec, _ := services(t, backend)
	px := make([][]*testutil.Proxy, 3)
	etcdVia := make([][]string, 3)
	redisVia := make([]string, 3)
	for i := range px {
		for _, ep := range ec.Endpoints {
			p := testutil.NewProxy(t, ep)
			px[i] = append(px[i], p)
			etcdVia[i] = append(etcdVia[i], p.Addr())
		}
		if cfg.Redis != "" {
			p := testutil.NewProxy(t, cfg.Redis)
			px[i] = append(px[i], p)
			redisVia[i] = p.Addr()
		}
	}
	cfg.Via = func(i int) ([]string, string) { return etcdVia[i], redisVia[i] }
	return startCluster(t, cfg), px
}

// partitionedLeader cuts the leader off from etcd and Redis (its bytes
// held, not refused: calls hang) under load: a standby takes over with a
// higher term, the cut leader steps down on its own and acknowledges no
// put from a client still connected to it; healed, it follows as a
// standby, and nothing acknowledged is lost.
func partitionedLeader(t *testing.T, backend string) {
	cl, px := partitionable(t, backend)
	c := client(t, cl)
	ctx := ctxT(t, 2*time.Minute)
	leader, role, err := cl.WaitLeader(ctx, -1)
	require.NoError(t, err)
	dc := direct(t, ctx, cl, leader)
	load := bench.StartHALoad(c, bench.HALoadConfig{Rate: 200, ValueSize: 4096})
	waitServing(t, load)

	for _, p := range px[leader] {
		p.Partition(true)
	}
	t0 := time.Now()
	next, d := takenOver(t, ctx, cl, load, leader, role, t0)
	t.Logf("leader %d cut off, leader %d serving after %.2f s", leader, next, d.Seconds())
	require.Eventually(t, func() bool {
		r, err := cl.Role(ctx, leader)
		return err == nil && r.Role != "leader"
	}, time.Minute, 20*time.Millisecond, "the cut leader never stepped down")
	assert.Zero(t, directPuts(ctx, dc, load, "direct/cut", 3, 2*time.Second), "the cut leader acknowledged puts")

	for _, p := range px[leader] {
		p.Partition(false)
	}
	_, err = cl.WaitRole(ctx, leader, "standby")
	require.NoError(t, err)
	waitServing(t, load)
	verify(t, c, load, 4096)
}

func TestPartitionedLeaderEtcd(t *testing.T)  { partitionedLeader(t, "etcd") }
func TestPartitionedLeaderRedis(t *testing.T) { partitionedLeader(t, "redis") }

// TestPartitionedStandbyLeads: a standby cut off from etcd while the
// leader keeps acknowledging puts falls behind the log; once healed, the
// leader and the other standby are killed, so it must lead: it serves
// only with the whole log, and every acknowledged put is there.
func TestPartitionedStandbyLeads(t *testing.T) {
	cl, px := partitionable(t, "etcd")
	c := client(t, cl)
	ctx := ctxT(t, 2*time.Minute)
	leader, role, err := cl.WaitLeader(ctx, -1)
	require.NoError(t, err)
	cut, other := (leader+1)%3, (leader+2)%3
	_, err = cl.WaitRole(ctx, cut, "standby")
	require.NoError(t, err)
	load := bench.StartHALoad(c, bench.HALoadConfig{Rate: 200, ValueSize: 4096})
	waitServing(t, load)

	for _, p := range px[cut] {
		p.Partition(true)
	}
	before := len(load.Acked())
	time.Sleep(2 * ttl) // the leader goes on; the cut standby cannot tail
	require.Greater(t, len(load.Acked()), before, "the leader stopped while a standby was cut off")
	for _, p := range px[cut] {
		p.Partition(false)
	}
	t0 := time.Now()
	require.NoError(t, cl.Kill(other))
	require.NoError(t, cl.Kill(leader))
	next, d := takenOver(t, ctx, cl, load, leader, role, t0)
	require.Equal(t, cut, next, "the only master left")
	t.Logf("standby %d, cut off for %v, leads after %.2f s", cut, 2*ttl, d.Seconds())
	waitServing(t, load)
	verify(t, c, load, 4096)
}
