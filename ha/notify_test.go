package ha

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/internal/testsvc"
)

// signalled waits for a notification.
func signalled(t *testing.T, n Notifier) {
	t.Helper()
	select {
	case <-n.Changed():
	case <-time.After(wait):
		t.Fatal("no notification")
	}
}

// drain takes a pending notification, if any.
func drain(n Notifier) {
	select {
	case <-n.Changed():
	default:
	}
}

// hidden is a store offering neither a watch nor a wake-up.
type hidden struct{ oplog.Store }

func TestNotifierLocalAndPolling(t *testing.T) {
	es, _ := sampleLog(t, 200)
	for _, tc := range []struct {
		name string
		wrap func(oplog.Store) oplog.Store
		kind any
	}{
		{"wake-up", func(s oplog.Store) oplog.Store { return s }, &wakeNotifier{}},
		{"polling", func(s oplog.Store) oplog.Store { return hidden{s} }, &pollNotifier{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := oplog.OpenLocal(t.TempDir(), oplog.LocalOptions{})
			require.NoError(t, err)
			defer st.Close()
			n := NewNotifier(tc.wrap(st), NotifyOptions{PollInterval: time.Millisecond})
			assert.IsType(t, tc.kind, n)
			for i := range 5 {
				drain(n)
				require.NoError(t, st.Append(ctxT(t), 1, es[i:i+1]))
				signalled(t, n)
			}
			require.NoError(t, n.Close())
			require.NoError(t, n.Close(), "closing twice is fine")
		})
	}
}

// A watch whose revision was compacted is re-established from the
// present, and notifies: what it missed is in the store.
func TestNotifierEtcdCompactedRevision(t *testing.T) {
	es, _ := sampleLog(t, 200)
	e := testsvc.StartEtcd(t)
	cli := newEtcdCli(t, e)
	w := openEtcd(t, cli, 1)
	for i := range 5 {
		require.NoError(t, w.Append(ctxT(t), 1, es[i:i+1]))
	}
	resp, err := cli.Get(ctxT(t), "any")
	require.NoError(t, err)
	_, err = cli.Compact(ctxT(t), resp.Header.Revision)
	require.NoError(t, err)

	c, key := w.Watched()
	n := newEtcdNotifier(c, key, NotifyOptions{RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond, startRev: 2})
	defer n.Close()
	signalled(t, n)
	require.Eventually(t, func() bool { return n.Rearms() >= 1 }, wait, time.Millisecond, "re-armed after the compaction")
	r0 := n.Rearms()
	for i := 5; i < 10; i++ {
		drain(n)
		require.NoError(t, w.Append(ctxT(t), 1, es[i:i+1]))
		signalled(t, n)
	}
	assert.Equal(t, r0, n.Rearms(), "the new watch holds")
}

// A follower keeps following across a restart of the etcd member: its
// safety timer is off, so only the (re-armed) watch wakes it.
func TestFollowerEtcdMemberRestart(t *testing.T) {
	e := testsvc.StartEtcd(t)
	w := openEtcd(t, newEtcdCli(t, e), 1)
	r := openEtcd(t, newEtcdCli(t, e), 0)
	ld := newLeader(t, w)
	replica := newReplica(t, newClock())
	f := newFollower(t, r, replica, 0, FollowerOptions{Safety: time.Hour,
		Notify: NotifyOptions{RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond}})
	ld.load(t, 2, 400, 31)
	require.NoError(t, f.WaitApplied(ctxT(t), ld.durable(t)))

	for round := range 1 {
		start := time.Now()
		require.NoError(t, e.Restart())
		t.Logf("restart took %v", time.Since(start))
		ld.load(t, 2, 400, 40+uint64(round))
		last := ld.durable(t)
		t.Logf("load written by %v", time.Since(start))
		require.NoError(t, f.WaitApplied(ctxT(t), last), "round %d", round)
		t.Logf("followed by %v", time.Since(start))
		assert.Equal(t, dump(t, ld.m), dump(t, replica))
	}
	require.NoError(t, f.Err())
	t.Logf("stats after restarts: %+v", f.Stats())
}

// A hole in the stored log (a batch record gone) stops the follower
// with ErrChecksum before it: it never skips over it.
func TestFollowerEtcdHole(t *testing.T) {
	es, _ := sampleLog(t, 200)
	e := testsvc.StartEtcd(t)
	cli := newEtcdCli(t, e)
	w := openEtcd(t, cli, 1)
	for i := 0; i < 50; i += 10 {
		require.NoError(t, w.Append(ctxT(t), 1, es[i:i+10])) // one batch each
	}
	_, err := cli.Delete(ctxT(t), "crescent/oplog/c1/batches/00000000000000000021")
	require.NoError(t, err)

	replica := newReplica(t, newClock())
	f := newFollower(t, openEtcd(t, newEtcdCli(t, e), 0), replica, 0, FollowerOptions{})
	err = f.WaitApplied(ctxT(t), 50)
	require.ErrorIs(t, err, ErrChecksum)
	require.ErrorIs(t, err, oplog.ErrCorrupt)
	// The reader's index, listed after the delete, lacks batch 21, so the
	// store already sees batch 11 end short of where it should.
	assert.EqualValues(t, 10, f.Applied())
	var ae *ApplyError
	require.ErrorAs(t, err, &ae)
	assert.EqualValues(t, 11, ae.Seq)
	assert.EqualValues(t, 1, f.Stats().ApplyErrors)
}
