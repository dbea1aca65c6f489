package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
	"github.com/crescent-kv/crescent/internal/syncbuf"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// enode is an engine on software NICs with one registered buffer.
type enode struct {
	e    *engine.Engine
	pool *mempool.Pool
	buf  []byte
	devs []*soft.Device
}

func newEngine(tb testing.TB, f *soft.Fabric, nics, size int, cfg engine.Config) *enode {
	tb.Helper()
	n := &enode{}
	for i := range nics {
		d := f.NewDevice(fmt.Sprintf("mlx5_%d", i), soft.Options{})
		n.devs = append(n.devs, d)
		cfg.RDMA.Devices = append(cfg.RDMA.Devices, d)
	}
	cfg.LocalServerName = "127.0.0.1"
	if cfg.Protocols == nil {
		cfg.Protocols = []string{"rdma", "tcp"}
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	p, err := mempool.New(mempool.Options{Size: int64(size), SlabSize: 1 << 20, Name: "crescent-rdma-engine-test"})
	if err != nil {
		tb.Fatal(err)
	}
	n.pool = p
	if n.buf, err = p.Alloc(size); err != nil {
		tb.Fatal(err)
	}
	if n.e, err = engine.New(cfg); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := n.e.Close(); err != nil {
			tb.Errorf("close: %v", err)
		}
		for _, d := range n.devs {
			if err := d.Close(); err != nil {
				tb.Errorf("device: %v", err)
			}
		}
		p.Close()
	})
	if err := n.e.RegisterMemory(n.buf, "cpu:0"); err != nil {
		tb.Fatal(err)
	}
	return n
}

func (n *enode) addr(off int) uint64 { return transport.AddrOf(n.buf) + uint64(off) }

func (n *enode) posted() uint64 {
	var s uint64
	for _, d := range n.devs {
		s += d.Stats().PostedWRs
	}
	return s
}

func waitBatch(tb testing.TB, e *engine.Engine, b engine.BatchID) engine.BatchStatus {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := e.Wait(ctx, b)
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

// TestEngineRoundTrips moves many sizes both ways between two engines
// whose rdma transport runs on software NICs, and checks every byte.
func TestEngineRoundTrips(t *testing.T) {
	f := soft.NewFabric()
	a := newEngine(t, f, 2, 32<<20, engine.Config{})
	b := newEngine(t, f, 2, 32<<20, engine.Config{})
	if got := a.e.Transports(); len(got) != 2 || got[0] != "rdma" {
		t.Fatalf("transports %v", got)
	}
	seg, err := a.e.OpenSegment(context.Background(), b.e.Name())
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{1, 3, 100, 4095, 4096, 4097, 65535, 65536, 65537, 200000, 1 << 20, 1<<20 + 3, 3<<20 + 17}
	before := a.posted()
	for _, op := range []engine.OpCode{engine.Write, engine.Read} {
		bid, err := a.e.AllocateBatch(len(sizes))
		if err != nil {
			t.Fatal(err)
		}
		var reqs []engine.Request
		off := 0
		for i, sz := range sizes {
			if op == engine.Write {
				testutil.Fill(a.buf[off:off+sz], uint64(i))
			} else {
				testutil.Fill(b.buf[off:off+sz], uint64(100+i))
			}
			reqs = append(reqs, engine.Request{Op: op, Local: a.buf[off : off+sz], Target: seg, TargetAddr: b.addr(off)})
			off += sz + 4096
		}
		if err := a.e.Submit(bid, reqs); err != nil {
			t.Fatal(err)
		}
		st := waitBatch(t, a.e, bid)
		if st.Status != engine.Completed || st.Completed != len(sizes) {
			t.Fatalf("%v: %+v", op, st)
		}
		off = 0
		for _, sz := range sizes {
			mustEqual(t, fmt.Sprintf("%v %d", op, sz), a.buf[off:off+sz], b.buf[off:off+sz])
			off += sz + 4096
		}
		if err := a.e.FreeBatch(bid); err != nil {
			t.Fatal(err)
		}
	}
	if a.posted() == before {
		t.Fatal("the rdma transport carried nothing")
	}
	if err := a.e.CloseSegment(seg); err != nil {
		t.Fatal(err)
	}
}

// TestEngineTimeoutReleasesAfterReset: a stalled NIC makes the request
// TIMEOUT at its deadline; the batch cannot be freed (the buffer may
// still be touched) until the transport reset the QP and let go.
func TestEngineTimeoutReleasesAfterReset(t *testing.T) {
	f := soft.NewFabric()
	cfg := engine.Config{TransferTimeout: 300 * time.Millisecond}
	cfg.RDMA = rdma.Config{FlushTimeout: 700 * time.Millisecond, SweepInterval: 10 * time.Millisecond}
	a := newEngine(t, f, 1, 4<<20, cfg)
	b := newEngine(t, f, 1, 4<<20, engine.Config{})
	seg, err := a.e.OpenSegment(context.Background(), b.e.Name())
	if err != nil {
		t.Fatal(err)
	}
	bid, _ := a.e.AllocateBatch(2)
	if err := a.e.Submit(bid, []engine.Request{{Op: engine.Write, Local: a.buf[:4096], Target: seg, TargetAddr: b.addr(0)}}); err != nil {
		t.Fatal(err)
	}
	if st := waitBatch(t, a.e, bid); st.Status != engine.Completed {
		t.Fatalf("warm-up %+v", st)
	}
	a.e.FreeBatch(bid)
	a.devs[0].Inject(soft.Fault{Kind: soft.FaultHang})
	bid, _ = a.e.AllocateBatch(1)
	if err := a.e.Submit(bid, []engine.Request{{Op: engine.Write, Local: a.buf[:1<<20], Target: seg, TargetAddr: b.addr(0)}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := a.e.Wait(ctx, bid)
	if st.Status != engine.Timeout || !errors.Is(err, transport.ErrTimeout) {
		t.Fatalf("status %+v, err %v", st, err)
	}
	// The QP is not reset yet (FlushTimeout > TransferTimeout): the
	// transport still owns the buffer.
	if err := a.e.FreeBatch(bid); !errors.Is(err, engine.ErrBatchBusy) {
		t.Fatalf("FreeBatch right after TIMEOUT: %v", err)
	}
	eventually(t, "transport to release the request", func() bool { return a.e.FreeBatch(bid) == nil })
	if a.devs[0].Stats().Resets == 0 {
		t.Fatal("released without resetting the QP")
	}
	if err := a.e.UnregisterMemory(ctx, a.buf); err != nil {
		t.Fatal(err)
	}
	if err := a.e.RegisterMemory(a.buf, "cpu:0"); err != nil {
		t.Fatal(err)
	}
}

// TestEngineFallsBackWithoutDevices: with no devices configured on this
// host (no RDMA NIC), the rdma transport is skipped with one Info line
// and the engine runs on tcp.
func TestEngineFallsBackWithoutDevices(t *testing.T) {
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, err := engine.New(engine.Config{LocalServerName: "127.0.0.1", Protocols: []string{"rdma", "tcp"}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got := e.Transports(); len(got) != 1 || got[0] != "tcp" {
		if len(got) == 2 {
			t.Skip("this host has RDMA devices")
		}
		t.Fatalf("transports %v", got)
	}
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "rdma") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "level=INFO") || !strings.Contains(lines[0], "not supported") {
		t.Fatalf("rdma log lines: %q", lines)
	}
	t.Log(lines[0])
}
