package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testsvc"
)

// TestCrashRecoverySnapshots is TestCrashRecovery with snapshots every
// 50 ms and a log compacted down to 20 entries below the latest, so the
// kills land before, during and after snapshots and compactions, and
// restarts recover from a snapshot plus the log's tail.
func TestCrashRecoverySnapshots(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	// Two at a time (-parallel defaults to GOMAXPROCS): each waits on its
	// child master and client round trips much of the time.
	t.Parallel()
	lines := runCrashRecovery(t, crashRounds/2, "--snapshot_interval", "50ms", "--oplog_retain", "20", "--snapshot_retain", "2")
	fromSnap := 0
	for _, l := range lines {
		if !strings.Contains(l, "snapshot=\"\"") && !strings.Contains(l, "snapshot= ") {
			fromSnap++
		}
	}
	t.Logf("%d of %d restarts began from a snapshot", fromSnap, len(lines))
	require.Greater(t, fromSnap, len(lines)/2, "restarts recovered from snapshots:\n%s", strings.Join(lines, "\n"))
}

// TestCrashRecoveryEtcdSnapshots: the same over the etcd log, with the
// snapshots in --snapshot_dir and the etcd batches compacted under them.
func TestCrashRecoveryEtcdSnapshots(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	// Two at a time (-parallel defaults to GOMAXPROCS): each waits on its
	// child master and client round trips much of the time.
	t.Parallel()
	e := testsvc.StartEtcd(t)
	lines := crashRecovery(t, crashRounds/2, "--oplog", e.URL(), "--cluster_id", "crashsnap", "--snapshot_dir", t.TempDir(),
		"--snapshot_interval", "50ms", "--oplog_retain", "20", "--snapshot_retain", "2")
	fromSnap := 0
	for _, l := range lines {
		if !strings.Contains(l, "snapshot=\"\"") && !strings.Contains(l, "snapshot= ") {
			fromSnap++
		}
	}
	t.Logf("%d of %d restarts began from a snapshot", fromSnap, len(lines))
	require.Greater(t, fromSnap, len(lines)/2, "restarts recovered from snapshots:\n%s", strings.Join(lines, "\n"))
}
