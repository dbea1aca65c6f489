package event

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// benchEvent is a typical engine event: one block of 16 tokens.
func benchEvent(i int) *BlockStored {
	return &BlockStored{BlockHashes: []Hash{HashOf(uint64(i)*2654435761 + 1<<40)},
		ParentBlockHash: Ptr(HashOf(uint64(i) + 1<<41)),
		TokenIDs:        []uint32{151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644, 77091, 198, 151667},
		BlockSize:       16, Medium: "GPU", GroupIdx: Ptr(0), KVCacheSpecKind: "full_attention"}
}

func benchBatch(n int) *EventBatch {
	b := &EventBatch{Timestamp: 1700000000.5, DataParallelRank: Ptr(0)}
	for i := range n {
		b.Events = append(b.Events, benchEvent(i))
	}
	return b
}

func BenchmarkEncodeBatch64(b *testing.B) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		b.Run(enc.String(), func(b *testing.B) {
			batch := benchBatch(64)
			buf, _ := AppendBatch(nil, batch, enc)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf, _ = AppendBatch(buf[:0], batch, enc)
			}
			b.ReportMetric(float64(64*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func BenchmarkDecodeBatch64(b *testing.B) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		b.Run(enc.String(), func(b *testing.B) {
			payload, _ := EncodeBatch(benchBatch(64), enc)
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeBatch(payload); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(64*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkPublish is the producer's cost of one Publish call (one event)
// while the sender drains the queue (no subscriber, so the network is
// out of the picture). DropOldest never waits; Block may wait for room.
func BenchmarkPublish(b *testing.B) {
	for _, pol := range []OverflowPolicy{DropOldest, Block} {
		b.Run(pol.String(), func(b *testing.B) {
			p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: ModeBind, Overflow: pol})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
			evs := make([]Event, 1024)
			for i := range evs {
				evs[i] = benchEvent(i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_ = p.Publish(evs[i&1023])
				i++
			}
		})
	}
	b.Run("parallel-block", func(b *testing.B) {
		p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: ModeBind})
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close(context.Background())
		ev := benchEvent(1)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = p.Publish(ev)
			}
		})
	})
}

// BenchmarkEndToEnd publishes b.N events in batches of up to 64 through
// a Publisher (Block, NoDrop: nothing may be lost) over TCP loopback to a
// Subscriber that decodes every batch, and fails on any loss.
func BenchmarkEndToEnd(b *testing.B) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		b.Run(enc.String(), func(b *testing.B) {
			p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: ModeBind,
				Encoding: enc, MaxBatchEvents: 64, Overflow: Block, NoDrop: true, SendHWM: 256})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
			var got, gaps atomic.Int64
			done := make(chan struct{})
			want := int64(b.N)
			sub, err := Subscribe(SubscriberConfig{
				Sources: []Source{{Endpoint: p.Endpoint()}},
				OnBatch: func(d Delivery) {
					if got.Add(int64(len(d.Batch.Events))) == want {
						close(done)
					}
				},
				OnGap: func(Gap) { gaps.Add(1) },
			})
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := p.WaitSubscribers(ctx, 1); err != nil {
				b.Fatal(err)
			}
			evs := make([]Event, 64)
			for i := range evs {
				evs[i] = benchEvent(i)
			}
			payload, _ := EncodeBatch(&EventBatch{Events: evs}, enc)
			b.SetBytes(int64(len(payload) / 64))
			b.ReportAllocs()
			b.ResetTimer()
			for sent := 0; sent < b.N; sent += 64 {
				if err := p.Publish(evs[:min(64, b.N-sent)]...); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-done:
			case <-ctx.Done():
				b.Fatalf("received %d of %d events", got.Load(), b.N)
			}
			b.StopTimer()
			if gaps.Load() != 0 || p.Stats().SubscriberDrops != 0 {
				b.Fatalf("loss: %d gaps, %+v", gaps.Load(), p.Stats())
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkLoopbackBaseline is the physical reference for BenchmarkEndToEnd:
// a raw TCP loopback stream of the same bytes per event, one write per
// 64-event message, no framing or codec.
func BenchmarkLoopbackBaseline(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	payload, _ := EncodeBatch(benchBatch(64), EncodingMap)
	done := make(chan int64)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- 0
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		done <- n
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload) / 64))
	b.ResetTimer()
	for sent := 0; sent < b.N; sent += 64 {
		if _, err := c.Write(payload); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
	<-done
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
