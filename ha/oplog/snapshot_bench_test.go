package oplog

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/master"
)

var (
	snapBenchKeys  = flag.Int("snapbench.keys", 1_000_000, "objects in BenchmarkSnapshot's master")
	snapBenchChurn = flag.Int("snapbench.churn", 0, "times each key is put and removed before its last put (the log grows, the state does not)")
)

// BenchmarkSnapshot builds a durable master holding -snapbench.keys
// complete objects (a PutStart and a PutEnd entry each; with
// -snapbench.churn=N each key is first put and removed N times, 3 more
// entries each) and measures, in
// the same run: a first snapshot (the whole log replayed into a scratch
// master, exported, encoded), a steady-state one (the previous snapshot
// loaded, a short tail replayed), the body's size, and recovery from the
// snapshot against recovery by replaying the whole log (the baseline),
// with the ratio. Run it with -benchtime=1x.
func BenchmarkSnapshot(b *testing.B) {
	ctx := context.Background()
	keys := *snapBenchKeys
	dir := b.TempDir()
	cfg := master.Config{Shards: 1024}
	d, err := OpenDurable(ctx, dir, cfg, LocalOptions{SegmentBytes: 8 << 20})
	if err != nil {
		b.Fatal(err)
	}
	benchMount(b, d.Master)
	put := func(k string) { benchPut(b, d.Master, k) }
	for i := range keys {
		k := fmt.Sprintf("bench/%09d", i)
		for range *snapBenchChurn {
			put(k)
			if err := d.Master.Remove(k, true); err != nil {
				b.Fatal(err)
			}
		}
		put(k)
	}
	if err := d.Wait(ctx); err != nil {
		b.Fatal(err)
	}
	snaps := newMemSnaps()
	cat := memCatalog{snaps}
	sn, err := NewSnapshotter(d.Store, SnapshotConfig{Payloads: snaps, Catalog: cat, Master: cfg, LogRetain: -1})
	if err != nil {
		b.Fatal(err)
	}
	// The baseline: recovery by replaying the whole log (before
	// compaction removes it).
	if err := d.Close(); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	full, err := OpenDurable(ctx, dir, cfg, LocalOptions{SegmentBytes: 8 << 20})
	if err != nil {
		b.Fatal(err)
	}
	fullTook, replayed := full.Took, full.Replayed
	d = full
	sn.st = d.Store
	b.ResetTimer()
	for range b.N {
		first, err := sn.Take(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for i := range 1000 {
			put(fmt.Sprintf("tail/%09d", i))
		}
		if err := d.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		steady, err := sn.Take(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Close(); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		r, err := OpenDurable(ctx, dir, cfg, LocalOptions{SegmentBytes: 8 << 20}, WithSnapshots(snaps, cat))
		if err != nil {
			b.Fatal(err)
		}
		ms := func(x time.Duration) float64 { return float64(x) / float64(time.Millisecond) }
		b.ReportMetric(ms(first.Took), "first-snapshot-ms")
		b.ReportMetric(ms(steady.Took), "snapshot-ms")
		b.ReportMetric(float64(steady.Meta.Size)/(1<<20), "snapshot-MiB")
		b.ReportMetric(float64(steady.Meta.Size)/float64(keys), "snapshot-B/key")
		b.ReportMetric(ms(steady.ScratchLongestHold), "scratch-longest-hold-ms")
		b.ReportMetric(ms(steady.ScratchLongestShardHold), "scratch-longest-shard-hold-ms")
		b.ReportMetric(ms(r.Took), "recover-snapshot-ms")
		b.ReportMetric(ms(fullTook), "recover-full-log-ms")
		b.ReportMetric(float64(fullTook)/float64(r.Took), "speedup")
		b.Logf("%d keys: full log replay %v (%d entries); first snapshot %v; steady snapshot %v (%d records, %d B, %d entries replayed after the previous one); recovery from it %v (%d entries after it); longest pause of the serving master %v",
			keys, fullTook, replayed, first.Took, steady.Took, steady.Records, steady.Meta.Size, steady.Replayed, r.Took, r.Replayed, steady.LongestPause)
		d = r
		sn.st = d.Store
	}
	b.StopTimer()
	d.Close()
}

// benchClient owns the segments benchMount mounts and the objects
// benchPut puts.
var benchClient = master.UUID{Hi: 1, Lo: 1}

// benchMount mounts 8 segments of 1 TiB on m, room for any key count.
func benchMount(b *testing.B, m *master.Master) {
	for i := range 8 {
		if err := m.MountSegment(benchClient, alloc.Segment{ID: master.UUID{Hi: 2, Lo: uint64(i)}, Name: fmt.Sprint("h", i),
			Base: uint64(i+1) << 44, Size: 1 << 40, Protocol: "tcp"}); err != nil {
			b.Fatal(err)
		}
	}
}

// benchPut puts a complete object k (a PutStart and a PutEnd entry).
func benchPut(b *testing.B, m *master.Master, k string) {
	if _, err := m.PutStart(benchClient, k, 4096+uint64(len(k))*64, master.ReplicateConfig{}); err != nil {
		b.Fatal(err)
	}
	if err := m.PutEnd(benchClient, k, master.Memory, nil); err != nil {
		b.Fatal(err)
	}
}
