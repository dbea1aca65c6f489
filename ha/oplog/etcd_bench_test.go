package oplog

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/crescent-kv/crescent/internal/testsvc"
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
