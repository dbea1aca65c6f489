package oplog

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/store/master"
)

// BenchmarkLocalAppend appends 200-byte payloads from 1 and 16
// concurrent appenders. The same run measures its baseline: a raw
// write+fdatasync loop of the same record bytes to a file in the same
// directory, one fdatasync per entry (what durability costs without group
// commit), and reports the ratio.
func BenchmarkLocalAppend(b *testing.B) {
	for _, appenders := range []int{1, 16} {
		b.Run(fmt.Sprintf("appenders=%d", appenders), func(b *testing.B) {
			dir := b.TempDir()
			l, err := OpenLocal(dir, LocalOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			const size = 200
			es := mkEntries(1, b.N, 1, size)
			recBytes := len(appendRecord(nil, &es[0]))
			b.SetBytes(size)
			b.ReportAllocs()
			before := l.Stats()
			var (
				mu   sync.Mutex
				next int
				wg   sync.WaitGroup
				errc = make(chan error, appenders)
			)
			b.ResetTimer()
			start := time.Now()
			for g := 0; g < appenders; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						mu.Lock()
						if next == b.N {
							mu.Unlock()
							return
						}
						i := next
						next++
						c, err := l.AppendAsync(ctx, 1, es[i:i+1])
						mu.Unlock()
						if err == nil {
							err = <-c
						}
						if err != nil {
							errc <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			close(errc)
			for err := range errc {
				b.Fatal(err)
			}
			st := l.Stats()
			rate := float64(b.N) / elapsed.Seconds()
			b.ReportMetric(rate, "entries/s")
			b.ReportMetric(float64(st.Fsyncs-before.Fsyncs)/float64(b.N), "fsyncs/entry")
			b.ReportMetric(float64(st.Entries-before.Entries)/float64(st.Batches-before.Batches), "entries/batch")

			base := rawFsyncRate(b, dir, recBytes, min(b.N, 2000))
			b.ReportMetric(base, "baseline_entries/s")
			b.ReportMetric(rate/base, "ratio")
			b.Logf("appenders=%d n=%d: %.0f entries/s, baseline (write+fdatasync per %d-byte record) %.0f entries/s, ratio %.2f",
				appenders, b.N, rate, recBytes, base, rate/base)
		})
	}
}

// rawFsyncRate is entries/s of a plain write+fdatasync loop.
func rawFsyncRate(b *testing.B, dir string, recBytes, n int) float64 {
	f, err := os.OpenFile(filepath.Join(dir, "baseline"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	rec := make([]byte, recBytes)
	start := time.Now()
	for i := 0; i < n; i++ {
		if _, err := f.Write(rec); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}

// BenchmarkSinkCommit is a durable master's commit path without the
// master: conc handlers in a closed loop each log one op and wait for
// it (Sink over Local, as OpenDurable builds it), with 1 syncer (one
// fdatasync after the other) to 4 (2 is the default), in alternating
// rounds so that all see the same disk. It reports commits/s, the mean
// wait and the mean fdatasync of each, and the default's ratio to 1.
func BenchmarkSinkCommit(b *testing.B) {
	syncers := []int{1, 2, 3, 4}
	for _, conc := range []int{2, 4, 8} {
		b.Run(fmt.Sprintf("handlers=%d", conc), func(b *testing.B) {
			const rounds = 6
			ops := make([]int, len(syncers))
			took := make([]time.Duration, len(syncers))
			wait := make([]time.Duration, len(syncers))
			fsyncs := make([]uint64, len(syncers))
			fsyncNs := make([]uint64, len(syncers))
			for round := 0; round < rounds*len(syncers); round++ {
				k := round % len(syncers)
				l, err := OpenLocal(b.TempDir(), LocalOptions{Syncers: syncers[k]})
				if err != nil {
					b.Fatal(err)
				}
				s, err := NewSink(ctx, l, SinkConfig{Term: 1})
				if err != nil {
					b.Fatal(err)
				}
				// The first append creates the segment (zero-filled, tens of
				// ms): outside the timed part, or it weighs on short rounds.
				s.Append(sinkOp(0))
				if err := s.WaitDurable(ctx, s.Appended()); err != nil {
					b.Fatal(err)
				}
				st0 := l.Stats()
				n := max(b.N/rounds, conc)
				var (
					wg    sync.WaitGroup
					mu    sync.Mutex
					left  = n
					waits time.Duration
				)
				start := time.Now()
				for g := 0; g < conc; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var w time.Duration
						for i := 0; ; i++ {
							mu.Lock()
							if left == 0 {
								waits += w
								mu.Unlock()
								return
							}
							left--
							mu.Unlock()
							s.Append(sinkOp(i))
							t := time.Now()
							if err := s.WaitDurable(ctx, s.Appended()); err != nil {
								b.Error(err)
								return
							}
							w += time.Since(t)
						}
					}()
				}
				wg.Wait()
				took[k] += time.Since(start)
				wait[k] += waits
				ops[k] += n
				st := l.Stats()
				fsyncs[k] += st.Fsyncs - st0.Fsyncs
				fsyncNs[k] += st.FsyncNanos - st0.FsyncNanos
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
				if err := l.Close(); err != nil {
					b.Fatal(err)
				}
			}
			rate := func(k int) float64 { return float64(ops[k]) / took[k].Seconds() }
			for k, n := range syncers {
				sfx := fmt.Sprintf("_syncers=%d", n)
				b.ReportMetric(rate(k), "commits/s"+sfx)
				b.ReportMetric(float64(wait[k].Microseconds())/float64(ops[k]), "wait_us"+sfx)
				b.ReportMetric(float64(fsyncNs[k])/float64(max(fsyncs[k], 1))/1e3, "fsync_us"+sfx)
			}
			b.ReportMetric(rate(slices.Index(syncers, 2))/rate(0), "ratio_2_over_1")
		})
	}
}

// BenchmarkSinkBatches: producers append bursts of ops (as a batch RPC
// does) and wait for them, through a Sink into a Local log; cpu-ns/entry
// is the process's CPU per entry (encoding, writing, syncing, waking),
// the figure the CPU-bound paths care about. CRESCENT_BENCH_OPLOG_DIR
// puts the log elsewhere (a tmpfs, to leave the disk's flush out).
func BenchmarkSinkBatches(b *testing.B) {
	const producers, burst = 4, 128
	dir := os.Getenv("CRESCENT_BENCH_OPLOG_DIR")
	if dir == "" {
		dir = b.TempDir()
	} else {
		var err error
		if dir, err = os.MkdirTemp(dir, "sinkbench-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	l, err := OpenLocal(dir, LocalOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	s, err := NewSink(ctx, l, SinkConfig{Term: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	s.Append(sinkOp(0)) // creates the segment, outside the timed part
	if err := s.WaitDurable(ctx, s.Appended()); err != nil {
		b.Fatal(err)
	}
	ops := make([]*master.Op, 4096)
	for i := range ops {
		ops[i] = sinkOp(i)
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; left.Add(-burst) > -burst; i++ {
				for j := range burst {
					s.Append(ops[(i*burst+j)%len(ops)])
				}
				if err := s.WaitDurable(ctx, s.Appended()); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/entry")
}
