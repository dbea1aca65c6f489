package service

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/storepb"
)

// benchMaster (as in the core's benchmarks) is a master with default config (1024 shards) and n
// segments of 1 TiB each: the master never touches memory, so capacity
// costs nothing.
func benchMaster(b testing.TB, n int) *master.Master {
	b.Helper()
	m, err := master.New(master.Config{Clock: clock.Real{}})
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		s := alloc.Segment{ID: master.UUID{Hi: 5, Lo: uint64(i + 1)}, Name: fmt.Sprint("host:", i), Base: uint64(i+1) << 44, Size: 1 << 40}
		if err := m.MountSegment(mastertest.Client(uint64(i+1)), s); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// blockKey (as in the core's benchmarks) is "model/layer/block-%08d" without fmt's allocations.
func blockKey(_ []byte, i int) string {
	var b [32]byte
	out := append(b[:0], "model/layer/block-"...)
	var d [20]byte
	num := strconv.AppendInt(d[:0], int64(i), 10)
	for range 8 - len(num) {
		out = append(out, '0')
	}
	return string(append(out, num...))
}

// BenchmarkGRPCBatchPut is the same through gRPC on loopback: one op is
// one BatchPutStart + BatchPutEnd RPC pair of 128 objects; "parallel"
// keeps GOMAXPROCS*4 pairs in flight over one connection.
func BenchmarkGRPCBatchPut(b *testing.B) {
	const batch = 128
	for _, par := range []bool{false, true} {
		name := "serial"
		if par {
			name = "parallel"
		}
		b.Run(name, func(b *testing.B) {
			m := benchMaster(b, 4)
			c, _ := serve(b, m)
			ctx := context.Background()
			var next atomic.Int64
			sizes := slices.Repeat([]uint64{4096}, batch)
			id := pbID(mastertest.Client(1))
			one := func(keys []string, buf []byte) {
				base := int(next.Add(batch)) - batch
				for i := range keys {
					keys[i] = blockKey(buf, base+i)
				}
				r1, err := c.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: id, Keys: keys, Sizes: sizes})
				if err != nil {
					b.Fatal(err)
				}
				if r1.Results[0].ErrorCode != 0 {
					b.Fatal(errcode.Code(r1.Results[0].ErrorCode))
				}
				r2, err := c.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: id, Keys: keys})
				if err != nil || r2.Results[0].ErrorCode != 0 {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			start := time.Now()
			if par {
				b.SetParallelism(4)
				b.RunParallel(func(pb *testing.PB) {
					keys := make([]string, batch)
					var buf []byte
					for pb.Next() {
						one(keys, buf)
					}
				})
			} else {
				keys := make([]string, batch)
				var buf []byte
				for b.Loop() {
					one(keys, buf)
				}
			}
			b.ReportMetric(float64(next.Load())/time.Since(start).Seconds(), "objects/s")
		})
	}
}

// BenchmarkReserveReply is one reserve spec's answer encoded, decoded and
// unpacked as a client reads it, in both forms: where the packed form
// pays (packMin).
func BenchmarkReserveReply(b *testing.B) {
	for _, n := range []int{1, 2, 16} {
		rs := make([]master.Reservation, n)
		for i := range rs {
			rs[i] = master.Reservation{ID: uint64(i + 1), Size: 1 << 20, Replicas: []master.Replica{{Type: master.Memory,
				SegmentName: "127.0.0.1:12345", SegmentID: master.UUID{Hi: 1, Lo: 2}, Addr: uint64(i) << 20, Size: 1 << 20, Protocol: "shm"}}}
		}
		for _, packed := range []bool{false, true} {
			b.Run(fmt.Sprintf("n=%d/packed=%v", n, packed), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					buf, err := proto.Marshal(&storepb.CommitPutResponse{Reserved: []*storepb.ReserveResult{reservationsPB(packed, rs)}})
					if err != nil {
						b.Fatal(err)
					}
					var in storepb.CommitPutResponse
					if err := proto.Unmarshal(buf, &in); err != nil {
						b.Fatal(err)
					}
					got := len(in.Reserved[0].Reservations)
					if p := in.Reserved[0].Packed; p != nil {
						reps, err := p.Unpack(len(in.Reserved[0].PackedIds))
						if err != nil {
							b.Fatal(err)
						}
						got = len(reps)
					}
					if got != n {
						b.Fatalf("%d reservations, want %d", got, n)
					}
				}
			})
		}
	}
}

// handlerRig is what the handler tests and benchmarks call: a Service
// over a master of 4 segments, client 1's id, and n sizes of 4 KiB.
func handlerRig(tb testing.TB, n int) (*Service, *storepb.UUID, []uint64) {
	return New(benchMaster(tb, 4)), pbID(mastertest.Client(1)), slices.Repeat([]uint64{4096}, n)
}

// BenchmarkBatchPutHandlers is the handlers alone, in process, as the
// store client calls them (packed replies): one op is one BatchPutStart
// + BatchPutEnd of 128 new 4 KiB objects; -benchmem shows what a batch
// allocates besides the master's own records.
func BenchmarkBatchPutHandlers(b *testing.B) {
	const batch = 128
	s, id, sizes := handlerRig(b, batch)
	ctx := context.Background()
	keys := make([]string, batch)
	next := 0
	b.ReportAllocs()
	for b.Loop() {
		for i := range keys {
			keys[i] = blockKey(nil, next+i)
		}
		next += batch
		r1, err := s.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: id, Keys: keys, Sizes: sizes, Packed: true})
		if err != nil || r1.Packed == nil {
			b.Fatal(err, r1)
		}
		r2, err := s.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: id, Keys: keys, Packed: true})
		if err != nil || r2.PackedResults == nil {
			b.Fatal(err, r2)
		}
	}
}

// BenchmarkBatchGetHandler is BatchGetReplicaList alone, in process, as
// the store client calls it (packed): one op is one batch of 16 keys
// among 100,000 stored.
func BenchmarkBatchGetHandler(b *testing.B) {
	const batch, stored = 16, 100_000
	s, id, sizes := handlerRig(b, 128)
	ctx := context.Background()
	all := make([]string, 0, stored)
	for len(all) < stored {
		ks := make([]string, 128)
		for i := range ks {
			ks[i] = blockKey(nil, len(all)+i)
		}
		if _, err := s.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: id, Keys: ks, Sizes: sizes, Packed: true}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: id, Keys: ks, Packed: true}); err != nil {
			b.Fatal(err)
		}
		all = append(all, ks...)
	}
	keys := make([]string, batch)
	next := 0
	b.ReportAllocs()
	for b.Loop() {
		for i := range keys {
			keys[i] = all[(next*7919)%stored] // scattered, as a reader's keys are
			next++
		}
		r, err := s.BatchGetReplicaList(ctx, &storepb.BatchGetReplicaListRequest{Keys: keys, Packed: true})
		if err != nil || r.Packed == nil {
			b.Fatal(err, r)
		}
	}
}
