package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/local"
)

// metric is the value of an unlabelled counter or gauge on /metrics.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	_, body := httpGet(t, url+"/metrics")
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			require.NoError(t, err)
			return f
		}
	}
	t.Fatalf("/metrics lacks %s", name)
	return 0
}

// allStopped reports whether every thread of pid is stopped (state T).
func allStopped(t *testing.T, pid int) bool {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	require.NoError(t, err)
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces, so after the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' && b[i+2] != 't' {
			return false
		}
	}
	return len(tasks) > 0
}

// TestHotCacheStoppedClient: crescent-client caches K (a hit); it is
// stopped (SIGSTOP) while another host force-removes K and re-puts it
// with other bytes: the remove still answers (the master waits at most
// its InvalidationTTL for the stopped subscriber), and once the client
// runs again its dummy reads the new bytes, never the old.
func TestHotCacheStoppedClient(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	tm := startMaster(t, "127.0.0.1:0")
	sock := filepath.Join(openDir(t), "crescent.sock")
	rc := startRealClient(t, tm, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := store.New(ctx, store.Config{MasterAddr: tm.addr, LocalHostname: "127.0.0.1", GlobalSegmentSize: 16 << 20,
		LocalBufferSize: 8 << 20})
	require.NoError(t, err)
	defer b.Close()
	d, err := local.Dial(ctx, sock)
	require.NoError(t, err)
	defer d.Close()

	old, cur := dummyVal("k-old", 256<<10), dummyVal("k-new", 256<<10)
	rcfg := store.ReplicateConfig{Preferred: []string{b.SegmentName()}} // not in the stopped process
	require.NoError(t, b.Put(ctx, "k", old, rcfg))
	for range 2 { // the second miss admits k
		v, err := d.GetBuffer(ctx, "k")
		require.NoError(t, err)
		require.True(t, bytes.Equal(old, v.Bytes()))
		v.Release()
	}
	// The subscription may lapse for a moment on a loaded machine (a
	// miss then): try until a get is a hit.
	eventually(t, "a hot hit", func() bool {
		hits := metric(t, rc.url, "crescent_hot_cache_hits_total")
		v, err := d.Get(ctx, "k")
		require.NoError(t, err)
		require.True(t, bytes.Equal(old, v))
		return metric(t, rc.url, "crescent_hot_cache_hits_total") == hits+1
	})

	require.NoError(t, rc.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := true
	// A group stop reaches each thread when it next runs: wait until
	// every one is stopped, or one could still acknowledge the remove.
	eventually(t, "every thread of crescent-client stopped", func() bool { return allStopped(t, rc.cmd.Process.Pid) })
	defer func() {
		if stopped {
			rc.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	timeouts := tm.m.InvalidationTimeouts()
	require.NoError(t, b.Remove(ctx, "k", true))
	require.NoError(t, b.Put(ctx, "k", cur, rcfg))
	require.Greater(t, tm.m.InvalidationTimeouts(), timeouts, "the master did not wait for the stopped subscriber")
	require.NoError(t, rc.cmd.Process.Signal(syscall.SIGCONT))
	stopped = false

	for range 3 {
		v, err := d.Get(ctx, "k")
		if err == nil && bytes.Equal(old, v) {
			t.Logf("stale misses %v, resets %v", metric(t, rc.url, "crescent_hot_cache_stale_misses_total"), metric(t, rc.url, "crescent_hot_cache_resets_total"))
		}
		if err != nil {
			require.ErrorIs(t, err, errcode.ErrObjectNotFound)
			continue
		}
		require.False(t, bytes.Equal(old, v), "the stopped client's cache served the removed value")
		require.True(t, bytes.Equal(cur, v))
	}
}
