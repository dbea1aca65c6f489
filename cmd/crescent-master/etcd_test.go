package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestCrashRecoveryEtcd is TestCrashRecovery with the log in an
// embedded etcd (in this process; the master is a child process killed
// with SIGKILL at least 20 times).
func TestCrashRecoveryEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	// Two at a time (-parallel defaults to GOMAXPROCS): each waits on its
	// child master and client round trips much of the time.
	t.Parallel()
	e := testsvc.StartEtcd(t)
	crashRecovery(t, crashRounds, "--oplog", e.URL(), "--cluster_id", "crash")
}

func TestLoadOplog(t *testing.T) {
	c, err := load([]string{"--oplog", "etcd://127.0.0.1:2379,127.0.0.2:2379", "--cluster_id", "c1"})
	require.NoError(t, err)
	assert.Equal(t, "etcd://127.0.0.1:2379,127.0.0.2:2379", c.Oplog)
	assert.Equal(t, "c1", c.ClusterID)
	assert.Equal(t, int64(30), c.OplogWriteTimeoutSec)
	path := filepath.Join(t.TempDir(), "m.yaml")
	require.NoError(t, os.WriteFile(path, []byte("oplog: etcd://10.0.0.1:2379;10.0.0.2:2379\ncluster_id: prod\noplog_write_timeout_sec: 5\n"), 0o600))
	c, err = load([]string{"--config", path})
	require.NoError(t, err)
	assert.Equal(t, "etcd://10.0.0.1:2379;10.0.0.2:2379", c.Oplog)
	assert.Equal(t, "prod", c.ClusterID)
	assert.Equal(t, int64(5), c.OplogWriteTimeoutSec)
	require.NoError(t, os.WriteFile(path, []byte("oplog: etcd://10.0.0.1:2379\ndata_dir: /var/lib/crescent\n"), 0o600))
	_, err = load([]string{"--config", path})
	assert.ErrorContains(t, err, "exclusive")
	for _, args := range [][]string{
		{"--oplog", "etcd://127.0.0.1:2379", "--data_dir", t.TempDir()}, // one log only
		{"--oplog", "http://127.0.0.1:2379"},
		{"--oplog", "etcd://127.0.0.1"},
		{"--oplog", "etcd://127.0.0.1:2379", "--cluster_id", ""},
		{"--oplog", "etcd://127.0.0.1:2379", "--cluster_id", "a/b"},
		{"--oplog", "etcd://127.0.0.1:2379", "--oplog_write_timeout_sec", "0"},
	} {
		_, err := load(args)
		assert.Error(t, err, "%v", args)
	}
}

// With the log in etcd, a stopped etcd makes the master fail-stop: a
// change is answered INTERNAL_ERROR (never acknowledged), and /health
// answers 503 with the cause; before, both work.
func TestRunEtcdFailStop(t *testing.T) {
	e := testsvc.StartEtcd(t)
	c := defaults()
	c.RPCAddress, c.RPCPort, c.MetricsPort = "127.0.0.1", testsvc.FreePort(t), testsvc.FreePort(t)
	c.Oplog, c.ClusterID, c.OplogWriteTimeoutSec, c.LogLevel = e.URL(), "failstop", 1, "error"
	ctx, stop := startRun(t, c)
	defer stop() // fail-stopped: its error is the log's

	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(c.RPCPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	mc := storepb.NewMasterClient(conn)
	require.Eventually(t, func() bool {
		_, err := mc.ServiceReady(ctx, &storepb.ServiceReadyRequest{})
		return err == nil
	}, 20*time.Second, 20*time.Millisecond)
	health := func() (int, string) {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(c.MetricsPort) + "/health")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	session, client := newSession()
	seg := &storepb.Segment{Id: &storepb.UUID{High: 3, Low: 4}, Name: "127.0.0.1:1", Base: 1 << 30, Size: 1 << 20, Protocol: "tcp"}
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	_, err = mc.MountSegment(rctx, &storepb.MountSegmentRequest{ClientId: client, Session: session, Segment: seg})
	require.NoError(t, err)
	_, err = mc.PutStart(rctx, &storepb.PutStartRequest{ClientId: client, Session: session, Key: "a", Size: 100})
	require.NoError(t, err)
	code, _ := health()
	require.Equal(t, http.StatusOK, code)
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(c.MetricsPort) + "/metrics")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), "crescent_oplog_durable_seq 2", "the log's metrics are on /metrics")
	assert.Contains(t, string(b), "crescent_oplog_etcd_txn_seconds_count")
	assert.Contains(t, string(b), "crescent_oplog_failed 0")

	e.Stop()
	_, err = mc.PutStart(rctx, &storepb.PutStartRequest{ClientId: client, Session: session, Key: "b", Size: 100})
	require.Error(t, err)
	assert.True(t, errors.Is(rpcerr.FromStatus(err), errcode.ErrInternal), "%v", err)
	code, body := health()
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.True(t, strings.Contains(body, "oplog"), "%q", body)
	// Nothing more is acknowledged, reads and Ping included.
	_, err = mc.PutEnd(rctx, &storepb.PutEndRequest{ClientId: client, Session: session, Key: "a"})
	assert.True(t, errors.Is(rpcerr.FromStatus(err), errcode.ErrInternal), "%v", err)
}
