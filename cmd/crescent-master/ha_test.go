package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/crescent-kv/crescent/bench"
	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/ha/supervisor"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master/admin"
)

func TestLoadHA(t *testing.T) {
	base := []string{"--oplog", "etcd://127.0.0.1:2379", "--rpc_address", "10.0.0.5"}
	c, err := load(append(base, "--ha_backend", "etcd"))
	require.NoError(t, err)
	assert.Equal(t, int64(5), c.HALeaseTTLSec)
	adv, err := c.advertise()
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.5:50051", adv)
	eps, err := c.haEndpoints()
	require.NoError(t, err)
	assert.Equal(t, []string{"127.0.0.1:2379"}, eps, "etcd defaults to the log's endpoints")

	path := filepath.Join(t.TempDir(), "m.yaml")
	require.NoError(t, os.WriteFile(path, []byte("oplog: etcd://10.0.0.1:2379\nha_backend: redis\nha_endpoints: 10.0.0.2:6379\n"+
		"ha_lease_ttl_sec: 2\nadvertise_address: m1.example:7000\n"), 0o600))
	c, err = load([]string{"--config", path})
	require.NoError(t, err)
	assert.Equal(t, "redis", c.HABackend)
	assert.Equal(t, "10.0.0.2:6379", c.HAEndpoints)
	assert.Equal(t, int64(2), c.HALeaseTTLSec)
	assert.Equal(t, "m1.example:7000", c.AdvertiseAddress)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ha_backend", "zk", "--oplog", "etcd://127.0.0.1:2379", "--advertise_address", "h:1"}, "want etcd or redis"},
		{[]string{"--ha_backend", "etcd", "--data_dir", t.TempDir(), "--advertise_address", "h:1"}, "cannot be followed"},
		{[]string{"--ha_backend", "etcd", "--advertise_address", "h:1"}, "needs --oplog"},
		{[]string{"--ha_backend", "etcd", "--oplog", "etcd://127.0.0.1:2379"}, "cannot dial \"0.0.0.0\""},
		{append(base, "--ha_backend", "etcd", "--advertise_address", ":7000"), "cannot dial"},
		{append(base, "--ha_backend", "etcd", "--advertise_address", "[::]:7000"), "cannot dial"},
		{append(base, "--ha_backend", "etcd", "--advertise_address", "h"), "advertise_address"},
		{append(base, "--ha_backend", "etcd", "--ha_lease_ttl_sec", "0"), "ha_lease_ttl_sec"},
		{append(base, "--ha_backend", "redis"), "needs --ha_endpoints"},
		{append(base, "--ha_backend", "redis", "--ha_endpoints", "a:1,b:2"), "one host:port"},
		{append(base, "--ha_backend", "etcd", "--ha_endpoints", "a"), "ha_endpoints"},
		{append(base, "--ha_backend", "etcd", "--rpc_port", "0"), "fixed rpc_port"},
		{append(base, "--ha_backend", "etcd", "--snapshot_dir", t.TempDir()), "needs --snapshot_catalog"},
	} {
		_, err := load(tc.args)
		assert.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
}

// haCluster runs HA masters from this test binary (childEnv makes it
// run main) through the harness crescent-bench ha and the chaos suite
// use; it returns once one leads.
func haCluster(t *testing.T, cfg bench.HAClusterConfig) *bench.HACluster {
	t.Helper()
	cfg.MasterBin, cfg.Env = os.Args[0], []string{childEnv + "=1"}
	cfg.ClusterID, cfg.Dir = "hatest", t.TempDir()
	cfg.Args = append([]string{"--client_ttl", "60", "--log_level", "info"}, cfg.Args...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := bench.StartHACluster(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			for i := range c.Masters {
				t.Logf("master %d output:\n%s", i, c.Log(i))
			}
		}
		c.Close()
	})
	return c
}

var httpc = &http.Client{Timeout: 2 * time.Second}

func getJSON(url string, v any) (int, error) {
	resp, err := httpc.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			return resp.StatusCode, fmt.Errorf("%s: %w (%q)", url, err, b)
		}
	}
	return resp.StatusCode, nil
}

func role(t *testing.T, c *bench.HACluster, i int) bench.HARole {
	t.Helper()
	r, err := c.Role(context.Background(), i)
	require.NoError(t, err)
	return r
}

// oneLeader waits until exactly one running master (but those in skip)
// serves and the others are standbys, and returns it.
func oneLeader(t *testing.T, within time.Duration, c *bench.HACluster, skip ...int) int {
	t.Helper()
	ctx := context.Background()
	got := -1
	require.Eventually(t, func() bool {
		got = -1
		for i := range c.Masters {
			if slices.Contains(skip, i) || !c.Running(i) {
				continue
			}
			if c.Serving(ctx, i) {
				if got >= 0 {
					return false // two serve: wait (and fail if it lasts)
				}
				got = i
			} else if r, err := c.Role(ctx, i); err != nil || r.Role == "leader" {
				return false
			}
		}
		return got >= 0
	}, within, 20*time.Millisecond, "no single leader")
	return got
}

func haClient(t *testing.T, masterAddr string) *store.Client {
	t.Helper()
	cl, err := store.New(context.Background(), store.Config{MasterAddr: masterAddr, GlobalSegmentSize: 32 << 20,
		LocalBufferSize: 8 << 20, Protocols: []string{"tcp"}, LocalHostname: "127.0.0.1", RPCTimeout: 2 * time.Second,
		HeartbeatInterval: 200 * time.Millisecond, PutRetries: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { cl.Close() })
	return cl
}

// putLoad puts keys through cl with 2 workers until stop is closed and
// returns the acknowledged ones. onCount is called with each op count.
func putLoad(cl *store.Client, prefix string, stop <-chan struct{}, onCount func(int64)) func() []string {
	var (
		mu    sync.Mutex
		acked []string
		n     atomic.Int64
		wg    sync.WaitGroup
	)
	ctx := context.Background()
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("%s/w%d/k%d", prefix, w, i)
				err := cl.Put(ctx, key, crashValue(key), store.ReplicateConfig{Replicas: 1})
				if err == nil {
					mu.Lock()
					acked = append(acked, key)
					mu.Unlock()
				}
				onCount(n.Add(1))
				if err != nil {
					time.Sleep(10 * time.Millisecond) // the master is gone: do not spin
				}
			}
		}()
	}
	return func() []string {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return acked
	}
}

// checkAcked reads every key through a fresh client of the new leader
// (re-dialled at the address /leader gives) and compares its content.
func checkAcked(t *testing.T, c *bench.HACluster, via int, keys []string) {
	t.Helper()
	var v supervisor.LeaderJSON
	_, err := getJSON("http://"+c.Masters[via].AdminAddr+"/leader", &v)
	require.NoError(t, err)
	require.Equal(t, c.Masters[via].RPCAddr, v.Leader, "/leader names the serving master")
	require.NotZero(t, v.ViewVersion)
	cl := haClient(t, v.Leader)
	for _, k := range keys {
		got, err := getRetry(context.Background(), cl, k)
		require.NoError(t, err, "acknowledged key %s", k)
		require.True(t, bytes.Equal(crashValue(k), got), "key %s content differs", k)
	}
}

// killLeader: three masters on one log; under put load the leader is
// killed with SIGKILL; a standby serves within two TTLs (plus slack for
// a loaded machine) and every acknowledged put is readable on it.
func killLeader(t *testing.T, cfg bench.HAClusterConfig, rounds int) {
	c := haCluster(t, cfg)
	ttl := c.LeaseTTL()
	lead := oneLeader(t, 30*time.Second, c)
	for i, m := range c.Masters {
		if i != lead {
			conn, err := net.DialTimeout("tcp", m.RPCAddr, time.Second)
			if err == nil {
				conn.Close()
			}
			require.Error(t, err, "a standby's RPC port is not bound")
		}
	}
	var all []string
	for round := range rounds {
		cl := haClient(t, c.Masters[lead].RPCAddr)
		stop := make(chan struct{})
		reached := make(chan struct{})
		var once sync.Once
		wait := putLoad(cl, fmt.Sprintf("r%d", round), stop, func(n int64) {
			if n == 40 {
				once.Do(func() { close(reached) })
			}
		})
		<-reached
		require.NoError(t, c.Kill(lead))
		killed := time.Now()
		close(stop)
		acked := wait()
		require.NotEmpty(t, acked, "no put was acknowledged: the test proves nothing")
		all = append(all, acked...)
		next := oneLeader(t, 2*ttl+5*time.Second, c)
		took := time.Since(killed)
		t.Logf("round %d: master %d killed with %d acknowledged puts; master %d serves after %.2fs (TTL %v)", round, lead, len(acked), next, took.Seconds(), ttl)
		assert.Less(t, took, 2*ttl+3*time.Second, "failover took more than 2 TTLs (+3s slack on a loaded machine)")
		checkAcked(t, c, next, all)
		// Restart the killed master, so three run again.
		require.NoError(t, c.Start(lead))
		_, err := c.WaitRole(context.Background(), lead, "standby")
		require.NoError(t, err)
		lead = next
	}
}

func TestHAKillLeaderEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	killLeader(t, bench.HAClusterConfig{Etcd: []string{e.Endpoint}, LeaseTTL: 2 * time.Second}, 2)
}

func TestHAKillLeaderRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	r := testsvc.StartRedis(t)
	killLeader(t, bench.HAClusterConfig{Backend: "redis", Etcd: []string{e.Endpoint}, Redis: r.Addr, LeaseTTL: time.Second}, 2)
}

// A leader stopped (SIGSTOP) for longer than the TTL is replaced; once
// it runs again (SIGCONT) it acknowledges nothing: a put sent to it
// fails and is not in the new leader's state; it goes back to standby
// and follows the new leader's log.
func TestHASigstopLeaderFenced(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	c := haCluster(t, bench.HAClusterConfig{Masters: 2, Etcd: []string{e.Endpoint}, LeaseTTL: 2 * time.Second})
	old := oneLeader(t, 30*time.Second, c)
	other := 1 - old
	cl := haClient(t, c.Masters[old].RPCAddr)
	ctx := context.Background()
	var keys []string
	for i := range 20 {
		k := fmt.Sprintf("before/%d", i)
		require.NoError(t, cl.Put(ctx, k, crashValue(k), store.ReplicateConfig{Replicas: 1}))
		keys = append(keys, k)
	}
	oldRole := role(t, c, old)

	require.NoError(t, c.Signal(old, syscall.SIGSTOP))
	stopped := time.Now()
	require.Equal(t, other, oneLeader(t, 30*time.Second, c, old))
	t.Logf("master %d serves %.2fs after master %d was stopped", other, time.Since(stopped).Seconds(), old)
	require.Greater(t, role(t, c, other).Term, oldRole.Term)

	// Put to the stopped master: the request waits in its socket until
	// SIGCONT, then meets a log claimed by a higher term.
	putErr := make(chan error, 1)
	go func() { putErr <- cl.Put(ctx, "after/0", crashValue("after/0"), store.ReplicateConfig{Replicas: 1}) }()
	require.NoError(t, c.Signal(old, syscall.SIGCONT))
	require.Error(t, <-putErr, "a deposed leader acknowledged a put")
	_, err := c.WaitRole(ctx, old, "standby")
	require.NoError(t, err, "the deposed leader did not go back to standby")
	out := c.Log(old)
	assert.True(t, strings.Contains(out, "leadership lost") || strings.Contains(out, "operation log failed: stepping down"),
		"the deposed leader says why it stopped")

	// The new leader never saw the refused put, has every earlier one,
	// and the old leader follows its log again.
	nc := haClient(t, c.Masters[other].RPCAddr)
	_, err = getRetry(ctx, nc, "after/0")
	require.ErrorIs(t, err, errcode.ErrObjectNotFound)
	require.NoError(t, nc.Put(ctx, "after/1", crashValue("after/1"), store.ReplicateConfig{Replicas: 1}))
	checkAcked(t, c, other, append(keys, "after/1"))
	want := role(t, c, other)
	require.Eventually(t, func() bool {
		r, err := c.Role(ctx, old)
		return err == nil && r.Role == "standby" && r.AppliedSeq >= want.AppliedSeq && r.Leader == c.Masters[other].RPCAddr
	}, 30*time.Second, 20*time.Millisecond)
	code, err := getJSON("http://"+c.Masters[old].AdminAddr+"/health", nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, code, "/health of a standby")
}

// SIGTERM on the leader: it stops serving, releases the view and exits
// 0; a standby serves well within one TTL (no lease to wait out, no
// warm-up after a clean release).
func TestHASigtermHandoff(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	const ttl = 4 * time.Second
	c := haCluster(t, bench.HAClusterConfig{Masters: 2, Etcd: []string{e.Endpoint}, LeaseTTL: ttl})
	old := oneLeader(t, 30*time.Second, c)
	other := 1 - old
	cl := haClient(t, c.Masters[old].RPCAddr)
	ctx := context.Background()
	require.NoError(t, cl.Put(ctx, "k", crashValue("k"), store.ReplicateConfig{Replicas: 1}))

	require.NoError(t, c.Signal(old, syscall.SIGTERM))
	sent := time.Now()
	require.Eventually(t, func() bool { return c.Serving(ctx, other) }, 30*time.Second, 10*time.Millisecond)
	took := time.Since(sent)
	t.Logf("SIGTERM hand-off: master %d serves %.2fs after the signal (TTL %v)", other, took.Seconds(), ttl)
	assert.Less(t, took, ttl, "a released leadership is taken over within one TTL")
	assert.Contains(t, c.Log(other), "no warm-up")
	<-c.Done(old)
	require.NoError(t, c.ExitErr(old), "exit status after SIGTERM")
	require.Equal(t, other, oneLeader(t, 30*time.Second, c))
	checkAcked(t, c, other, []string{"k"})
}

// metrics and pages of the HA admin port, on a leader, and the status
// page on a standby.
func TestHAAdminPages(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	c := haCluster(t, bench.HAClusterConfig{Masters: 2, Standby: true, Etcd: []string{e.Endpoint}, LeaseTTL: time.Second})
	p := oneLeader(t, 30*time.Second, c)
	base := "http://" + c.Masters[p].AdminAddr
	resp, err := httpc.Get(base + "/metrics")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`crescent_ha_role{role="leader"} 1`, `crescent_ha_role{role="standby"} 0`,
		"crescent_ha_elections_total 1", "crescent_ha_time_to_serve_seconds", "crescent_ha_term ",
		"crescent_ha_follower_applied_seq", "crescent_oplog_durable_seq"} {
		assert.Contains(t, string(b), want)
	}
	resp, err = httpc.Get(base + "/get_all_segments")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the leader serves the master's pages")
	// The status page shows the supervisor's role and term.
	r := role(t, c, p)
	var st admin.Status
	code, err := getJSON(base+"/status.json", &st)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, admin.Role{Role: "leader", Term: r.Term, Leader: r.Leader}, st.Role)
	assert.True(t, st.Serving)
	code, err = getJSON(base+"/", nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)

	// A standby serves the page too, with its role and nothing else.
	sb, err := c.Add()
	require.NoError(t, err)
	_, err = c.WaitRole(context.Background(), sb, "standby")
	require.NoError(t, err)
	st = admin.Status{}
	code, err = getJSON("http://"+c.Masters[sb].AdminAddr+"/status.json", &st)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "standby", st.Role.Role)
	assert.False(t, st.Serving)
	assert.Empty(t, st.Segments)
	code, err = getJSON("http://"+c.Masters[sb].AdminAddr+"/", nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
}

// Redis terms are only as durable as Redis: a fresh (or restarted)
// redis-server hands out term 1 again. The log, claimed before by a
// term of 1000, must not fence the new leader for ever: the supervisor
// builds the Redis coordinator with WithMinTerm(log's term), so the new
// term is above it and the claim succeeds.
func TestHARedisTermAboveLog(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	r := testsvc.StartRedis(t)
	cli, err := clientv3.New(oplog.EtcdClientConfig([]string{e.Endpoint}))
	require.NoError(t, err)
	defer cli.Close()
	st, err := oplog.OpenEtcd(context.Background(), cli, oplog.EtcdOptions{ClusterID: "hatest", Term: 1000})
	require.NoError(t, err)
	require.NoError(t, st.Close())

	c := haCluster(t, bench.HAClusterConfig{Masters: 1, Backend: "redis", Etcd: []string{e.Endpoint}, Redis: r.Addr, LeaseTTL: time.Second})
	p := oneLeader(t, 30*time.Second, c)
	assert.Greater(t, role(t, c, p).Term, uint64(1000))
	cl := haClient(t, c.Masters[p].RPCAddr)
	require.NoError(t, cl.Put(context.Background(), "k", crashValue("k"), store.ReplicateConfig{Replicas: 1}))
}

// With --snapshot_dir (shared by the masters) and a Redis catalog, a standby started after
// the log was compacted behind a snapshot builds its replica from the
// snapshot and follows from there; it then takes over with every
// acknowledged put.
func TestHASnapshotStandby(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	r := testsvc.StartRedis(t)
	c := haCluster(t, bench.HAClusterConfig{Masters: 2, Standby: true, Etcd: []string{e.Endpoint}, LeaseTTL: time.Second,
		Args: append([]string{"--snapshot_dir", t.TempDir(), "--snapshot_catalog", r.URL(), "--snapshot_interval", "0", "--oplog_retain", "0"}, adminArgs(t)...)})
	a := oneLeader(t, 30*time.Second, c)
	cl := haClient(t, c.Masters[a].RPCAddr)
	ctx := context.Background()
	var keys []string
	put := func(k string) {
		require.NoError(t, cl.Put(ctx, k, crashValue(k), store.ReplicateConfig{Replicas: 1}))
		keys = append(keys, k)
	}
	for i := range 20 {
		put(fmt.Sprintf("a/%d", i))
	}
	resp, err := adminPost(httpc, "http://"+c.Masters[a].AdminAddr+"/snapshot")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the leader's /snapshot")
	for i := range 5 {
		put(fmt.Sprintf("b/%d", i))
	}
	b, err := c.Add()
	require.NoError(t, err)
	want := role(t, c, a)
	require.Eventually(t, func() bool {
		r, err := c.Role(ctx, b)
		return err == nil && r.Role == "standby" && r.AppliedSeq == want.AppliedSeq
	}, 30*time.Second, 20*time.Millisecond, "the standby follows from the snapshot")
	assert.Contains(t, c.Log(b), "from_seq="+strconv.FormatUint(want.AppliedSeq-9, 10), "5 puts of 2 entries after the snapshot")
	require.NoError(t, c.Kill(a))
	require.Equal(t, b, oneLeader(t, 30*time.Second, c))
	checkAcked(t, c, b, keys)
}
