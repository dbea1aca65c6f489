package oplog

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/crescent-kv/crescent/ha/internal/vfs/errorfs"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/storepb"
)

// gather returns the crescent_oplog_* families of c by name.
func gather(t *testing.T, c prometheus.Collector) map[string]*dto.Metric {
	t.Helper()
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	fams, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]*dto.Metric{}
	for _, f := range fams {
		require.Len(t, f.Metric, 1, f.GetName())
		out[f.GetName()] = f.Metric[0]
	}
	return out
}

// logSome makes n puts through d's service and waits for them.
func logSome(t *testing.T, d *Durable, n int) {
	t.Helper()
	mc, _ := serveDurable(t, d)
	ctx := context.Background()
	_, err := mc.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: durClient, Session: durSession, Segment: durSeg})
	require.NoError(t, err)
	for i := range n {
		require.NoError(t, durPut(ctx, mc, "k"+string(rune('a'+i))))
	}
}

func TestCollectorLocal(t *testing.T) {
	leakCheck(t)
	fs := errorfs.New(nil)
	d, err := OpenDurable(context.Background(), t.TempDir(), master.Config{Shards: 4}, LocalOptions{FS: fs})
	require.NoError(t, err)
	defer d.Close()
	c := NewCollector(d)
	before := gather(t, c)
	assert.Equal(t, 0.0, before["crescent_oplog_durable_seq"].GetGauge().GetValue())
	assert.Equal(t, uint64(0), before["crescent_oplog_commit_entries"].GetHistogram().GetSampleCount())

	logSome(t, d, 5)
	m := gather(t, c)
	durable := m["crescent_oplog_durable_seq"].GetGauge().GetValue()
	assert.Equal(t, 11.0, durable, "a mount and 5 puts of 2 ops")
	assert.Equal(t, durable, m["crescent_oplog_appended_seq"].GetGauge().GetValue())
	assert.Equal(t, 11.0, m["crescent_oplog_entries_total"].GetCounter().GetValue())
	assert.Greater(t, m["crescent_oplog_bytes_written_total"].GetCounter().GetValue(), 11*20.0)
	h := m["crescent_oplog_commit_entries"].GetHistogram()
	assert.Positive(t, h.GetSampleCount())
	assert.Equal(t, 11.0, h.GetSampleSum())
	fsync := m["crescent_oplog_fsync_seconds"].GetHistogram()
	assert.GreaterOrEqual(t, fsync.GetSampleCount(), h.GetSampleCount(), "an fdatasync per commit")
	assert.Positive(t, fsync.GetSampleSum())
	assert.Equal(t, 0.0, m["crescent_oplog_failed"].GetGauge().GetValue())
	assert.Equal(t, 0.0, m["crescent_oplog_errors_total"].GetCounter().GetValue())

	// A failing fdatasync fails the log: the gauge and the counter say so.
	fs.FailNth(errorfs.OpSync, 1, true, nil)
	d.Master.Remove("ka", true)
	require.Error(t, d.Wait(context.Background()))
	m = gather(t, c)
	assert.Equal(t, 1.0, m["crescent_oplog_failed"].GetGauge().GetValue())
	assert.Equal(t, 1.0, m["crescent_oplog_errors_total"].GetCounter().GetValue())
	assert.Equal(t, durable, m["crescent_oplog_durable_seq"].GetGauge().GetValue())
	assert.Greater(t, m["crescent_oplog_appended_seq"].GetGauge().GetValue(), durable)
}

func TestCollectorEtcd(t *testing.T) {
	leakCheck(t)
	e := testsvc.StartEtcd(t)
	cli, err := clientv3.New(EtcdClientConfig([]string{e.Endpoint}))
	require.NoError(t, err)
	defer cli.Close()
	st, err := OpenEtcd(context.Background(), cli, EtcdOptions{ClusterID: "metrics"})
	require.NoError(t, err)
	d, err := Open(context.Background(), st, master.Config{Shards: 4})
	require.NoError(t, err)
	defer d.Close()
	c := NewCollector(d)
	logSome(t, d, 3)
	m := gather(t, c)
	assert.Equal(t, 7.0, m["crescent_oplog_durable_seq"].GetGauge().GetValue())
	assert.Equal(t, 7.0, m["crescent_oplog_entries_total"].GetCounter().GetValue())
	assert.Positive(t, m["crescent_oplog_bytes_written_total"].GetCounter().GetValue())
	txn := m["crescent_oplog_etcd_txn_seconds"].GetHistogram()
	assert.Positive(t, txn.GetSampleCount())
	assert.Positive(t, txn.GetSampleSum())
	assert.GreaterOrEqual(t, m["crescent_oplog_etcd_txns_total"].GetCounter().GetValue(), float64(txn.GetSampleCount()))
	assert.Equal(t, 7.0, m["crescent_oplog_commit_entries"].GetHistogram().GetSampleSum())
	_, hasFsync := m["crescent_oplog_fsync_seconds"]
	assert.False(t, hasFsync, "no fsync histogram for etcd")
}
