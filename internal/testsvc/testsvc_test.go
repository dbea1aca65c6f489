package testsvc

import (
	"bufio"
	"context"
	"github.com/crescent-kv/crescent/internal/redisproc"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	// This package's own code makes no HTTP calls: HTTP connections left
	// at the end are between the members of the embedded etcd cluster
	// (its peer transport), seen stuck in keep-alive once in CI after
	// TestEtcdClusterQuorum stopped members while others still ran.
	goleak.VerifyTestMain(m, append(GoleakIgnores(),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"))...)
}

func TestRedisStartStop(t *testing.T) {
	r := StartRedis(t)
	if err := redisproc.Ping(r.Addr); err != nil {
		t.Fatalf("ping %s: %v", r.Addr, err)
	}
	r.Stop()
	r.Stop() // idempotent
	if c, err := net.DialTimeout("tcp", r.Addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("redis still listening on %s after Stop", r.Addr)
	}
}

// TestRedisRestart: a restarted server answers on the same address,
// empty (persistence is off), and Stop still stops it.
func TestRedisRestart(t *testing.T) {
	r := StartRedis(t)
	send := func(cmd string) string {
		c, err := net.DialTimeout("tcp", r.Addr, time.Second)
		require.NoError(t, err)
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Write([]byte(cmd + "\r\n"))
		require.NoError(t, err)
		line, err := bufio.NewReader(c).ReadString('\n')
		require.NoError(t, err)
		return strings.TrimSpace(line)
	}
	require.Equal(t, "+OK", send("SET k v"))
	require.Equal(t, ":1", send("EXISTS k"))
	require.NoError(t, r.Restart())
	require.NoError(t, redisproc.Ping(r.Addr))
	require.Equal(t, ":0", send("EXISTS k"))
	r.Stop()
	_, err := net.DialTimeout("tcp", r.Addr, time.Second)
	require.Error(t, err, "redis still listening after Stop")
}

func TestRedisBadArgsFailFast(t *testing.T) {
	// redis-server exits on an unknown option: the start must report its
	// output instead of waiting for a server that never comes.
	if _, err := exec.LookPath("redis-server"); err != nil {
		MissingDep(t, "redis-server", err)
	}
	r, err := redisproc.Start("", "--no-such-option", "x")
	if err == nil {
		r.Close()
		t.Fatal("redis-server started with a bad option")
	}
	if !strings.Contains(err.Error(), "exited") {
		t.Fatalf("error %v does not say the server exited", err)
	}
}

func TestRedisExtraArgs(t *testing.T) {
	r := StartRedis(t, "--notify-keyspace-events", "K$gx")
	c, err := net.DialTimeout("tcp", r.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("CONFIG GET notify-keyspace-events\r\n"))
	// *2, $22, notify-keyspace-events, $N, <flags>
	rd := bufio.NewReader(c)
	var lines []string
	for len(lines) < 5 {
		l, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("reply %q: %v", lines, err)
		}
		lines = append(lines, strings.TrimSpace(l))
	}
	for _, f := range "K$gx" {
		if !strings.ContainsRune(lines[4], f) {
			t.Fatalf("notify-keyspace-events = %q, lacks %q: extra args not passed", lines[4], f)
		}
	}
}

func TestEtcdStartStop(t *testing.T) {
	e := StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get: %v %v", resp, err)
	}
}

// A 3-member cluster serves with one member down and not with two.
func TestEtcdClusterQuorum(t *testing.T) {
	c := StartEtcdCluster(t, 3)
	require.Len(t, c.Endpoints, 3)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	put := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := cli.Put(ctx, "k", "v")
		return err
	}
	require.NoError(t, put())
	lead := c.Leader()
	require.GreaterOrEqual(t, lead, 0)
	c.Stop(lead)
	require.Eventually(t, func() bool { return put() == nil }, 30*time.Second, 100*time.Millisecond)
	c.Stop((lead + 1) % 3)
	require.Error(t, put(), "a write without quorum succeeded")
}
