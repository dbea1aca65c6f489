package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store"
)

func TestLoadSnapshotSettings(t *testing.T) {
	c, err := load(nil)
	require.NoError(t, err)
	require.Equal(t, 10*time.Minute, c.SnapshotInterval)
	require.Equal(t, 3, c.SnapshotRetain)
	require.Equal(t, int64(100000), c.OplogRetain)
	require.Empty(t, c.SnapshotDir)

	path := filepath.Join(t.TempDir(), "master.yaml")
	require.NoError(t, os.WriteFile(path, []byte("data_dir: /d\nsnapshot_interval: 30s\nsnapshot_retain: 5\nsnapshot_dir: /s\noplog_retain: 7\n"), 0o600))
	c, err = load([]string{"--config", path, "--snapshot_retain", "2"})
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, c.SnapshotInterval)
	require.Equal(t, 2, c.SnapshotRetain)
	require.Equal(t, "/s", c.SnapshotDir)
	require.Equal(t, int64(7), c.OplogRetain)

	for _, args := range [][]string{
		{"--snapshot_interval", "-1s"},
		{"--snapshot_retain", "0"},
		{"--oplog_retain", "-1"},
		{"--snapshot_dir", "/s"}, // without --data_dir
		{"--data_dir", "/d", "--snapshot_catalog", "etcd://h:1"},
		{"--oplog", "etcd://h:1", "--snapshot_catalog", "redis://h:1"}, // no directory for the bodies
	} {
		_, err := load(args)
		require.Error(t, err, "%v", args)
	}
}

// TestSnapshotEndpoint: POST /snapshot on the admin port of a durable
// master takes a snapshot at the durable seq and answers its id, seq,
// size and timings; a restart recovers from it.
func TestSnapshotEndpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	dir := t.TempDir()
	port, admin := testsvc.FreePort(t), testsvc.FreePort(t)
	args := []string{"--rpc_address", "127.0.0.1", "--rpc_port", strconv.Itoa(port), "--metrics_port", strconv.Itoa(admin),
		"--data_dir", dir, "--snapshot_interval", "0", "--log_level", "info"}
	args = append(args, adminArgs(t)...)
	proc, _ := startMaster(t, args...)
	ctx := context.Background()
	cl, err := store.New(ctx, store.Config{MasterAddr: "127.0.0.1:" + strconv.Itoa(port), GlobalSegmentSize: 16 << 20,
		LocalBufferSize: 4 << 20, Protocols: []string{"tcp"}, LocalHostname: "127.0.0.1"})
	require.NoError(t, err)
	defer cl.Close()
	for i := range 20 {
		require.NoError(t, cl.Put(ctx, "k"+strconv.Itoa(i), []byte(strings.Repeat("v", 100+i)), store.ReplicateConfig{Replicas: 1}))
	}
	url := "http://127.0.0.1:" + strconv.Itoa(admin) + "/snapshot"
	resp, err := http.Get(url)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	resp, err = adminPost(http.DefaultClient, url)
	require.NoError(t, err)
	var info struct {
		ID             string  `json:"id"`
		Seq            uint64  `json:"seq"`
		Size           int64   `json:"size"`
		TookMs         float64 `json:"took_ms"`
		LongestPauseMs float64 `json:"longest_pause_ms"`
	}
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&info))
	resp.Body.Close()
	require.NotEmpty(t, info.ID)
	require.GreaterOrEqual(t, info.Seq, uint64(41), "a mount and 20 puts (two entries each)")
	require.Positive(t, info.Size)
	require.Zero(t, info.LongestPauseMs)
	_, err = os.Stat(filepath.Join(dir, "snapshots"))
	require.NoError(t, err, "snapshots default to DATA_DIR/snapshots")
	resp, err = http.Get("http://127.0.0.1:" + strconv.Itoa(admin) + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	metrics := string(body)
	assert.Contains(t, metrics, "crescent_snapshot_taken_total 1")
	assert.Contains(t, metrics, "crescent_snapshot_last_seq "+strconv.FormatUint(info.Seq, 10))
	assert.Contains(t, metrics, "crescent_snapshot_duration_seconds_count 1")

	proc.kill9(t)
	_, recovered := startMaster(t, args...)
	require.Contains(t, recovered, "snapshot="+info.ID)
	v, err := getRetry(ctx, cl, "k7")
	require.NoError(t, err)
	require.Equal(t, strings.Repeat("v", 107), string(v))
}

// TestSnapshotRedisCatalog: with --snapshot_catalog redis://, the catalog
// lives in a real redis-server (the bodies in the data directory) and a
// restart recovers from the snapshot it names.
func TestSnapshotRedisCatalog(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	r := testsvc.StartRedis(t)
	dir := t.TempDir()
	port, admin := testsvc.FreePort(t), testsvc.FreePort(t)
	args := []string{"--rpc_address", "127.0.0.1", "--rpc_port", strconv.Itoa(port), "--metrics_port", strconv.Itoa(admin),
		"--data_dir", dir, "--snapshot_interval", "0", "--snapshot_catalog", "redis://" + r.Addr, "--cluster_id", "rc",
		"--log_level", "info"}
	args = append(args, adminArgs(t)...)
	proc, _ := startMaster(t, args...)
	ctx := context.Background()
	cl, err := store.New(ctx, store.Config{MasterAddr: "127.0.0.1:" + strconv.Itoa(port), GlobalSegmentSize: 16 << 20,
		LocalBufferSize: 4 << 20, Protocols: []string{"tcp"}, LocalHostname: "127.0.0.1"})
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.Put(ctx, "k", []byte("value"), store.ReplicateConfig{Replicas: 1}))
	resp, err := adminPost(http.DefaultClient, "http://127.0.0.1:"+strconv.Itoa(admin)+"/snapshot")
	require.NoError(t, err)
	var info struct {
		ID string `json:"id"`
	}
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&info))
	resp.Body.Close()

	rc := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rc.Close()
	latest, err := rc.Get(ctx, "crescent:{rc}:latest").Result()
	require.NoError(t, err)
	assert.Equal(t, info.ID, latest)
	_, err = os.Stat(filepath.Join(dir, "snapshots", "LATEST"))
	assert.True(t, os.IsNotExist(err), "no local catalog beside the Redis one")

	proc.kill9(t)
	_, recovered := startMaster(t, args...)
	require.Contains(t, recovered, "snapshot="+info.ID)
	v, err := getRetry(ctx, cl, "k")
	require.NoError(t, err)
	require.Equal(t, "value", string(v))
}

// --oplog_syncers reaches the local log and is bounded.
func TestOplogSyncersFlag(t *testing.T) {
	c, err := load([]string{"--data_dir", t.TempDir(), "--oplog_syncers", "2"})
	require.NoError(t, err)
	require.Equal(t, 2, c.OplogSyncers)
	c, err = load([]string{"--data_dir", t.TempDir()})
	require.NoError(t, err)
	require.Equal(t, oplog.DefaultSyncers, c.OplogSyncers)
	for _, bad := range []string{"0", "17"} {
		_, err := load([]string{"--data_dir", t.TempDir(), "--oplog_syncers", bad})
		require.ErrorContains(t, err, "oplog_syncers", bad)
	}
}
