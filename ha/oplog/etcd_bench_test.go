package oplog

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store/master"
)

// BenchmarkEtcdRead reads a whole etcd log the way recovery does (Read,
// 1024 entries at a time) and reports entries/s; the baseline is the same
// batch keys read raw in one range request per 1024 keys, undecoded, in
// the same run. Batches of 1 entry are the log of a lightly loaded master
// (each op its own commit), batches of 64 a busy one's.
func BenchmarkEtcdRead(b *testing.B) {
	const entries = 4096
	for _, per := range []int{1, 64} {
		b.Run(fmt.Sprintf("per_batch=%d", per), func(b *testing.B) {
			e := testsvc.StartEtcd(b)
			cli := newCli(b, e)
			ctx := context.Background()
			s := openEtcd(b, cli, EtcdOptions{})
			all := ents(1, entries, 1, 120)
			for i := 0; i < entries; i += per {
				if err := s.Append(ctx, 1, all[i:i+per]); err != nil {
					b.Fatal(err)
				}
			}
			var readT, rawT time.Duration
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				n := 0
				for next := uint64(1); next <= entries; {
					es, err := s.Read(ctx, next, replayBatch)
					if err != nil {
						b.Fatal(err)
					}
					next += uint64(len(es))
					n += len(es)
				}
				readT += time.Since(t0)
				if n != entries {
					b.Fatalf("read %d entries, want %d", n, entries)
				}
				t0 = time.Now()
				key, end := s.batchKey(1), s.batchKey(entries)+"\x00"
				for {
					resp, err := cli.Get(ctx, key, clientv3.WithRange(end), clientv3.WithLimit(1024))
					if err != nil {
						b.Fatal(err)
					}
					if !resp.More {
						break
					}
					key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
				}
				rawT += time.Since(t0)
			}
			b.StopTimer()
			eps := float64(entries*b.N) / readT.Seconds()
			base := float64(entries*b.N) / rawT.Seconds()
			b.ReportMetric(eps, "entries/s")
			b.ReportMetric(base, "baseline_entries/s")
			b.ReportMetric(eps/base, "ratio")
		})
	}
}

var etcdRecoverKeys = flag.Int("etcdbench.keys", 1_000_000, "objects in BenchmarkEtcdRecovery's master")

// BenchmarkEtcdRecovery builds a master of -etcdbench.keys complete
// objects (a PutStart and a PutEnd entry each) logged in etcd and, for
// the baseline, the same ops logged in local files, then measures, in the
// same run, recovery by replaying each whole log (no snapshot): the time
// from Open to a serving master. Run it with -benchtime=1x.
func BenchmarkEtcdRecovery(b *testing.B) {
	ctx := context.Background()
	keys := *etcdRecoverKeys
	cfg := master.Config{Shards: 1024}
	e := testsvc.StartEtcd(b)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second,
		MaxCallRecvMsgSize: 4 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	dir := b.TempDir()
	openEtcdLog := func() Store {
		s, err := OpenEtcd(ctx, cli, EtcdOptions{Prefix: "bench", ClusterID: "recover"})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	openLocal := func() Store {
		s, err := OpenLocal(dir, LocalOptions{SegmentBytes: 8 << 20})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	for _, open := range []func() Store{openEtcdLog, openLocal} {
		d, err := Open(ctx, open(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		benchMount(b, d.Master)
		for i := range keys {
			benchPut(b, d.Master, fmt.Sprintf("bench/%09d", i))
		}
		if err := d.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		if err := d.Close(); err != nil {
			b.Fatal(err)
		}
	}
	var etcdT, localT time.Duration
	var replayed uint64
	b.ResetTimer()
	for range b.N {
		for _, x := range []struct {
			open func() Store
			took *time.Duration
		}{{openEtcdLog, &etcdT}, {openLocal, &localT}} {
			runtime.GC()
			t0 := time.Now()
			d, err := Open(ctx, x.open(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			*x.took += time.Since(t0)
			replayed = d.Replayed
			if got := d.Master.Stats().Keys; got != int64(keys) {
				b.Fatalf("recovered %d objects, want %d", got, keys)
			}
			if err := d.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	ms := func(x time.Duration) float64 { return float64(x) / float64(time.Millisecond) / float64(b.N) }
	b.ReportMetric(ms(etcdT), "recover-etcd-ms")
	b.ReportMetric(ms(localT), "baseline-recover-local-ms")
	b.ReportMetric(float64(localT)/float64(etcdT), "ratio")
	b.ReportMetric(float64(replayed)*float64(b.N)/etcdT.Seconds(), "etcd-entries/s")
}
