package tcp_test

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/tcp"
)

// The transport benchmarks and their raw-socket baseline use the same
// block sizes, buffer size and number of connections, so
// BenchmarkTCPWrite/1MiB ÷ BenchmarkRawTCP/1MiB is the ratio to the limit.

const (
	benchBuf   = 64 << 20
	benchLanes = 4
	// benchDepth is how many blocks are in flight at once (per transport).
	benchDepth = 64
)

var benchBlocks = []int{64 << 10, 1 << 20}

func blockName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

func BenchmarkTCPWrite(b *testing.B) { benchTCP(b, transport.Write) }
func BenchmarkTCPRead(b *testing.B)  { benchTCP(b, transport.Read) }

func benchTCP(b *testing.B, op transport.Op) {
	for _, block := range benchBlocks {
		b.Run(blockName(block), func(b *testing.B) {
			cfg := tcp.Config{Lanes: benchLanes}
			a := newNode(b, "a", benchBuf, cfg)
			t := newNode(b, "t", benchBuf, cfg)
			p := t.peer()
			perSubmit := max(1, (8<<20)/block)
			done := make(chan error, benchDepth)
			onDone := func(_ *transport.Task, _ int, err error) { done <- err }
			nblocks := benchBuf / block
			tasks := make([]*transport.Task, 0, perSubmit)
			b.SetBytes(int64(block))
			b.ReportAllocs()
			b.ResetTimer()
			inflight := 0
			for i := 0; i < b.N; {
				k := min(perSubmit, b.N-i, benchDepth-inflight)
				if k == 0 {
					if err := <-done; err != nil {
						b.Fatal(err)
					}
					inflight--
					continue
				}
				tasks = tasks[:0]
				for j := range k {
					off := ((i + j) % nblocks) * block
					tasks = append(tasks, transport.NewTask(op, a.buf[off:off+block], t.addr(off), soon(), onDone))
				}
				a.tr.Submit(p, tasks)
				inflight += k
				i += k
			}
			for ; inflight > 0; inflight-- {
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRawTCP streams the same blocks over benchLanes plain loopback
// connections (TCP_NODELAY, no framing, no acknowledgement): the limit
// the transport is measured against.
func BenchmarkRawTCP(b *testing.B) {
	for _, block := range benchBlocks {
		b.Run(blockName(block), func(b *testing.B) {
			a := newNode(b, "a", benchBuf, tcp.Config{})
			t := newNode(b, "t", benchBuf, tcp.Config{})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			nblocks := benchBuf / block
			share := func(k int) int { return b.N/benchLanes + btoi(k < b.N%benchLanes) }
			var wg sync.WaitGroup
			errs := make(chan error, 2*benchLanes)
			conns := make([]*net.TCPConn, benchLanes)
			for k := range benchLanes {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				s, err := ln.Accept()
				if err != nil {
					b.Fatal(err)
				}
				conns[k] = c.(*net.TCPConn)
				conns[k].SetNoDelay(true)
				s.(*net.TCPConn).SetNoDelay(true)
				defer c.Close()
				defer s.Close()
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Each receiver owns a slice of the target buffer.
					dst := t.buf[k*(benchBuf/benchLanes) : (k+1)*(benchBuf/benchLanes)]
					for i := range share(k) {
						off := (i * block) % (len(dst) - len(dst)%block)
						if _, err := io.ReadFull(s, dst[off:off+block]); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			b.SetBytes(int64(block))
			b.ReportAllocs()
			b.ResetTimer()
			for k, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range share(k) {
						off := ((i*benchLanes + k) % nblocks) * block
						if _, err := c.Write(a.buf[off : off+block]); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
		})
	}
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}
