package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/ha/supervisor"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
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

// haProc is one crescent-master process of an HA cluster.
type haProc struct {
	name    string
	cmd     *exec.Cmd
	rpc     string // advertised address
	admin   string
	done    chan struct{}
	waitErr error
	mu      sync.Mutex
	stderr  bytes.Buffer
	stopped atomic.Bool // SIGSTOPped
}

func (p *haProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

func (p *haProc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// startHA runs a crescent-master with args plus its own ports; it
// returns once the process is up (its admin port answers).
func startHA(t *testing.T, name string, args ...string) *haProc {
	t.Helper()
	rpcPort, adminPort := freePort(t), freePort(t)
	args = append([]string{"--rpc_address", "127.0.0.1", "--rpc_port", strconv.Itoa(rpcPort),
		"--metrics_port", strconv.Itoa(adminPort), "--client_ttl", "60", "--log_level", "info"}, args...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	pipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &haProc{name: name, cmd: cmd, rpc: "127.0.0.1:" + strconv.Itoa(rpcPort),
		admin: "http://127.0.0.1:" + strconv.Itoa(adminPort), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if p.stopped.Load() {
			cmd.Process.Signal(syscall.SIGCONT)
		}
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s output:\n%s", p.name, p.output())
		}
	})
	require.Eventually(t, func() bool {
		if !p.alive() {
			return true
		}
		_, err := p.role()
		return err == nil
	}, 30*time.Second, 20*time.Millisecond)
	require.True(t, p.alive(), "%s exited:\n%s", name, p.output())
	return p
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

func (p *haProc) role() (supervisor.RoleJSON, error) {
	var r supervisor.RoleJSON
	_, err := getJSON(p.admin+"/role", &r)
	return r, err
}

// serving: /role says leader and /health is 200.
func (p *haProc) serving() bool {
	r, err := p.role()
	if err != nil || r.Role != "leader" {
		return false
	}
	code, err := getJSON(p.admin+"/health", nil)
	return err == nil && code == http.StatusOK
}

func (p *haProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
	switch sig {
	case syscall.SIGSTOP:
		p.stopped.Store(true)
	case syscall.SIGCONT:
		p.stopped.Store(false)
	}
}

// oneLeader waits until exactly one of procs (the live, running ones)
// serves and the others are standbys, and returns it.
func oneLeader(t *testing.T, within time.Duration, procs ...*haProc) *haProc {
	t.Helper()
	var got *haProc
	require.Eventually(t, func() bool {
		got = nil
		for _, p := range procs {
			if !p.alive() || p.stopped.Load() {
				continue
			}
			if p.serving() {
				if got != nil {
					return false // two serve: wait (and fail if it lasts)
				}
				got = p
			} else if r, err := p.role(); err != nil || r.Role == "leader" {
				return false
			}
		}
		return got != nil
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
func checkAcked(t *testing.T, via *haProc, keys []string) {
	t.Helper()
	var v supervisor.LeaderJSON
	_, err := getJSON(via.admin+"/leader", &v)
	require.NoError(t, err)
	require.Equal(t, via.rpc, v.Leader, "/leader names the serving master")
	require.NotZero(t, v.ViewVersion)
	cl := haClient(t, v.Leader)
	for _, k := range keys {
		got, err := getRetry(context.Background(), cl, k)
		require.NoError(t, err, "acknowledged key %s", k)
		require.True(t, bytes.Equal(crashValue(k), got), "key %s content differs", k)
	}
}

func haArgs(backend string, ttl int, logURL string, extra ...string) []string {
	return append([]string{"--oplog", logURL, "--cluster_id", "hatest", "--ha_backend", backend,
		"--ha_lease_ttl_sec", strconv.Itoa(ttl)}, extra...)
}

// killLeader: three masters on one log; under put load the leader is
// killed with SIGKILL; a standby serves within two TTLs (plus slack for
// a loaded machine) and every acknowledged put is readable on it.
func killLeader(t *testing.T, args []string, ttl time.Duration, rounds int) {
	procs := []*haProc{startHA(t, "m0", args...), startHA(t, "m1", args...), startHA(t, "m2", args...)}
	lead := oneLeader(t, 30*time.Second, procs...)
	for _, p := range procs {
		if p != lead {
			c, err := net.DialTimeout("tcp", p.rpc, time.Second)
			if err == nil {
				c.Close()
			}
			require.Error(t, err, "a standby's RPC port is not bound")
		}
	}
	var all []string
	for round := range rounds {
		cl := haClient(t, lead.rpc)
		stop := make(chan struct{})
		reached := make(chan struct{})
		var once sync.Once
		wait := putLoad(cl, fmt.Sprintf("r%d", round), stop, func(n int64) {
			if n == 40 {
				once.Do(func() { close(reached) })
			}
		})
		<-reached
		lead.signal(t, syscall.SIGKILL)
		<-lead.done
		killed := time.Now()
		close(stop)
		acked := wait()
		require.NotEmpty(t, acked, "no put was acknowledged: the test proves nothing")
		all = append(all, acked...)
		var live []*haProc
		for _, p := range procs {
			if p.alive() {
				live = append(live, p)
			}
		}
		next := oneLeader(t, 2*ttl+5*time.Second, live...)
		took := time.Since(killed)
		t.Logf("round %d: %s killed with %d acknowledged puts; %s serves after %.2fs (TTL %v)", round, lead.name, len(acked), next.name, took.Seconds(), ttl)
		assert.Less(t, took, 2*ttl+3*time.Second, "failover took more than 2 TTLs (+3s slack on a loaded machine)")
		checkAcked(t, next, all)
		// Replace the killed master, so three run again.
		procs = append(live, startHA(t, fmt.Sprintf("m%d", 3+round), args...))
		lead = next
	}
}

func TestHAKillLeaderEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	killLeader(t, haArgs("etcd", 2, e.URL()), 2*time.Second, 2)
}

func TestHAKillLeaderRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	r := testsvc.StartRedis(t)
	killLeader(t, haArgs("redis", 1, e.URL(), "--ha_endpoints", r.Addr), time.Second, 2)
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
	args := haArgs("etcd", 2, e.URL())
	a, b := startHA(t, "m0", args...), startHA(t, "m1", args...)
	old := oneLeader(t, 30*time.Second, a, b)
	other := a
	if old == a {
		other = b
	}
	cl := haClient(t, old.rpc)
	ctx := context.Background()
	var keys []string
	for i := range 20 {
		k := fmt.Sprintf("before/%d", i)
		require.NoError(t, cl.Put(ctx, k, crashValue(k), store.ReplicateConfig{Replicas: 1}))
		keys = append(keys, k)
	}
	oldRole, err := old.role()
	require.NoError(t, err)

	old.signal(t, syscall.SIGSTOP)
	stopped := time.Now()
	require.Same(t, other, oneLeader(t, 30*time.Second, other))
	t.Logf("%s serves %.2fs after %s was stopped", other.name, time.Since(stopped).Seconds(), old.name)
	newRole, err := other.role()
	require.NoError(t, err)
	require.Greater(t, newRole.Term, oldRole.Term)

	// Put to the stopped master: the request waits in its socket until
	// SIGCONT, then meets a log claimed by a higher term.
	putErr := make(chan error, 1)
	go func() { putErr <- cl.Put(ctx, "after/0", crashValue("after/0"), store.ReplicateConfig{Replicas: 1}) }()
	old.signal(t, syscall.SIGCONT)
	require.Error(t, <-putErr, "a deposed leader acknowledged a put")
	require.Eventually(t, func() bool {
		r, err := old.role()
		return err == nil && r.Role == "standby"
	}, 30*time.Second, 20*time.Millisecond, "the deposed leader did not go back to standby")
	out := old.output()
	assert.True(t, strings.Contains(out, "leadership lost") || strings.Contains(out, "operation log failed: stepping down"),
		"the deposed leader says why it stopped")

	// The new leader never saw the refused put, has every earlier one,
	// and the old leader follows its log again.
	nc := haClient(t, other.rpc)
	_, err = getRetry(ctx, nc, "after/0")
	require.ErrorIs(t, err, errcode.ErrObjectNotFound)
	require.NoError(t, nc.Put(ctx, "after/1", crashValue("after/1"), store.ReplicateConfig{Replicas: 1}))
	checkAcked(t, other, append(keys, "after/1"))
	want, err := other.role()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, err := old.role()
		return err == nil && r.Role == "standby" && r.AppliedSeq >= want.AppliedSeq && r.Leader == other.rpc
	}, 30*time.Second, 20*time.Millisecond)
	code, err := getJSON(old.admin+"/health", nil)
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
	args := haArgs("etcd", int(ttl/time.Second), e.URL())
	a, b := startHA(t, "m0", args...), startHA(t, "m1", args...)
	old := oneLeader(t, 30*time.Second, a, b)
	other := a
	if old == a {
		other = b
	}
	cl := haClient(t, old.rpc)
	ctx := context.Background()
	require.NoError(t, cl.Put(ctx, "k", crashValue("k"), store.ReplicateConfig{Replicas: 1}))

	old.signal(t, syscall.SIGTERM)
	sent := time.Now()
	require.Eventually(t, other.serving, 30*time.Second, 10*time.Millisecond)
	took := time.Since(sent)
	t.Logf("SIGTERM hand-off: %s serves %.2fs after the signal (TTL %v)", other.name, took.Seconds(), ttl)
	assert.Less(t, took, ttl, "a released leadership is taken over within one TTL")
	assert.Contains(t, other.output(), "no warm-up")
	<-old.done
	require.NoError(t, old.waitErr, "exit status after SIGTERM")
	require.Same(t, other, oneLeader(t, 30*time.Second, other))
	checkAcked(t, other, []string{"k"})
}

// metrics and pages of the HA admin port, on a single master.
func TestHAAdminPages(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	p := startHA(t, "m0", haArgs("etcd", 1, e.URL())...)
	oneLeader(t, 30*time.Second, p)
	resp, err := httpc.Get(p.admin + "/metrics")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`crescent_ha_role{role="leader"} 1`, `crescent_ha_role{role="standby"} 0`,
		"crescent_ha_elections_total 1", "crescent_ha_time_to_serve_seconds", "crescent_ha_term ",
		"crescent_ha_follower_applied_seq", "crescent_oplog_durable_seq"} {
		assert.Contains(t, string(b), want)
	}
	resp, err = httpc.Get(p.admin + "/get_all_segments")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the leader serves the master's pages")
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

	p := startHA(t, "m0", haArgs("redis", 1, e.URL(), "--ha_endpoints", r.Addr)...)
	oneLeader(t, 30*time.Second, p)
	role, err := p.role()
	require.NoError(t, err)
	assert.Greater(t, role.Term, uint64(1000))
	cl := haClient(t, p.rpc)
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
	args := haArgs("etcd", 1, e.URL(), "--snapshot_dir", t.TempDir(), "--snapshot_catalog", r.URL(),
		"--snapshot_interval", "0", "--oplog_retain", "0")
	args = append(args, adminArgs(t)...)
	a := startHA(t, "m0", args...)
	oneLeader(t, 30*time.Second, a)
	cl := haClient(t, a.rpc)
	ctx := context.Background()
	var keys []string
	put := func(k string) {
		require.NoError(t, cl.Put(ctx, k, crashValue(k), store.ReplicateConfig{Replicas: 1}))
		keys = append(keys, k)
	}
	for i := range 20 {
		put(fmt.Sprintf("a/%d", i))
	}
	resp, err := adminPost(httpc, a.admin+"/snapshot")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "the leader's /snapshot")
	for i := range 5 {
		put(fmt.Sprintf("b/%d", i))
	}
	b := startHA(t, "m1", args...)
	want, err := a.role()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, err := b.role()
		return err == nil && r.Role == "standby" && r.AppliedSeq == want.AppliedSeq
	}, 30*time.Second, 20*time.Millisecond, "the standby follows from the snapshot")
	assert.Contains(t, b.output(), "from_seq="+strconv.FormatUint(want.AppliedSeq-9, 10), "5 puts of 2 entries after the snapshot")
	a.signal(t, syscall.SIGKILL)
	<-a.done
	oneLeader(t, 30*time.Second, b)
	checkAcked(t, b, keys)
}
