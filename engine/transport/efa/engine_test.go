package efa_test

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/efa"
	"github.com/crescent-kv/crescent/internal/fabric"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// enode is an engine with one registered buffer.
type enode struct {
	e    *engine.Engine
	pool *mempool.Pool
	buf  []byte
}

func newEngine(t testing.TB, size int, cfg engine.Config) *enode {
	t.Helper()
	cfg.LocalServerName = "127.0.0.1"
	cfg.Logger = quiet
	p, err := mempool.New(mempool.Options{Size: int64(size), SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := p.Alloc(size)
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	e, err := engine.New(cfg)
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	if err := e.RegisterMemory(buf, "cpu:0"); err != nil {
		e.Close()
		p.Close()
		t.Fatal(err)
	}
	n := &enode{e: e, pool: p, buf: buf}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		p.Close()
	})
	return n
}

func (n *enode) addr(off int) uint64 { return transport.AddrOf(n.buf) + uint64(off) }

func efaConfig(prov string) engine.Config {
	return engine.Config{Protocols: []string{"efa", "tcp"}, EFA: efa.Config{Provider: prov}, TransferTimeout: 30 * time.Second}
}

func open(t testing.TB, from, to *enode) engine.SegmentID {
	t.Helper()
	seg, err := from.e.OpenSegment(context.Background(), to.e.Name())
	if err != nil {
		t.Fatal(err)
	}
	return seg
}

// run submits reqs as one batch and waits for it.
func run(t testing.TB, e *engine.Engine, reqs []engine.Request) engine.BatchStatus {
	t.Helper()
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := e.Wait(ctx, b)
	if err != nil {
		t.Fatalf("batch: %v (%+v)", err, st)
	}
	if err := e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestEngineBothWays: two engines preferring efa move data both ways,
// 1 byte to 8 MiB, over the provider (not over tcp).
func TestEngineBothWays(t *testing.T) {
	needFabric(t)
	for _, prov := range providers() {
		t.Run(prov, func(t *testing.T) {
			needProvider(t, prov)
			a := newEngine(t, 32<<20, efaConfig(prov))
			b := newEngine(t, 32<<20, efaConfig(prov))
			if got := a.e.Transports(); got[0] != "efa" {
				t.Fatalf("transports %v", got)
			}
			segB, segA := open(t, a, b), open(t, b, a)
			before := fabric.ReadStats()
			sizes := []int{1, 100, 4096, 65536, 1 << 20, 8 << 20}
			var writes, reads []engine.Request
			off := 0
			for i, n := range sizes {
				testutil.Fill(a.buf[off:off+n], uint64(i+10))
				testutil.Fill(b.buf[16<<20+off:16<<20+off+n], uint64(i+20))
				writes = append(writes, engine.Request{Op: engine.Write, Local: a.buf[off : off+n], Target: segB, TargetAddr: b.addr(off)})
				reads = append(reads, engine.Request{Op: engine.Read, Local: a.buf[16<<20+off : 16<<20+off+n], Target: segB, TargetAddr: b.addr(16<<20 + off)})
				off += n
			}
			run(t, a.e, writes)
			run(t, a.e, reads)
			off = 0
			for i, n := range sizes {
				if !bytes.Equal(b.buf[off:off+n], a.buf[off:off+n]) {
					t.Fatalf("write of %d bytes: data differs", n)
				}
				if !bytes.Equal(a.buf[16<<20+off:16<<20+off+n], b.buf[16<<20+off:16<<20+off+n]) {
					t.Fatalf("read %d of %d bytes: data differs", i, n)
				}
				off += n
			}
			last := 16<<20 + off - (8 << 20) // b's 8 MiB block
			run(t, b.e, []engine.Request{{Op: engine.Write, Local: b.buf[last : last+8<<20], Target: segA, TargetAddr: a.addr(24 << 20)}})
			if !bytes.Equal(a.buf[24<<20:32<<20], b.buf[last:last+8<<20]) {
				t.Fatal("b -> a: data differs")
			}
			if d := fabric.ReadStats().Sub(before); d.Posted < uint64(2*len(sizes)+1) {
				t.Fatalf("only %d operations went through libfabric", d.Posted)
			}
		})
	}
}

// TestEngineBatch128 moves one batch of 128 requests each way.
func TestEngineBatch128(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	a := newEngine(t, 16<<20, efaConfig(prov))
	b := newEngine(t, 16<<20, efaConfig(prov))
	seg := open(t, a, b)
	reqs := make([]engine.Request, 128)
	for i := range reqs {
		testutil.Fill(a.buf[i<<16:(i+1)<<16], uint64(i))
		reqs[i] = engine.Request{Op: engine.Write, Local: a.buf[i<<16 : (i+1)<<16], Target: seg, TargetAddr: b.addr(i << 16)}
	}
	st := run(t, a.e, reqs)
	if st.Completed != 128 || st.Transferred != 128<<16 {
		t.Fatalf("status %+v", st)
	}
	if !bytes.Equal(b.buf[:8<<20], a.buf[:8<<20]) {
		t.Fatal("data differs")
	}
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Read, Local: a.buf[8<<20+i<<16 : 8<<20+(i+1)<<16], Target: seg, TargetAddr: b.addr(i << 16)}
	}
	run(t, a.e, reqs)
	if !bytes.Equal(a.buf[8<<20:16<<20], b.buf[:8<<20]) {
		t.Fatal("read data differs")
	}
}

// TestEngineOutOfBounds: a request outside the peer's buffers is refused
// by Submit, and nothing starts.
func TestEngineOutOfBounds(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	a := newEngine(t, 1<<20, efaConfig(prov))
	b := newEngine(t, 1<<20, efaConfig(prov))
	seg := open(t, a, b)
	bid, err := a.e.AllocateBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	before := fabric.ReadStats()
	err = a.e.Submit(bid, []engine.Request{
		{Op: engine.Write, Local: a.buf[:64], Target: seg, TargetAddr: b.addr(0)},
		{Op: engine.Write, Local: a.buf[:64], Target: seg, TargetAddr: b.addr(1<<20 - 32)},
	})
	var re *engine.RequestError
	if !errors.As(err, &re) || re.Index != 1 || !errors.Is(err, engine.ErrOutOfBounds) {
		t.Fatalf("Submit: %v, want ErrOutOfBounds for request 1", err)
	}
	if d := fabric.ReadStats().Sub(before); d.Posted != 0 {
		t.Fatalf("%d operations posted for a refused batch", d.Posted)
	}
	a.e.FreeBatch(bid)
}

// TestEngineTCPFallback: an engine preferring efa reaches a peer that has
// no efa over tcp.
func TestEngineTCPFallback(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	a := newEngine(t, 1<<20, efaConfig(prov))
	b := newEngine(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	seg := open(t, a, b)
	testutil.Fill(a.buf[:4096], 3)
	before := fabric.ReadStats()
	run(t, a.e, []engine.Request{{Op: engine.Write, Local: a.buf[:4096], Target: seg, TargetAddr: b.addr(0)}})
	if !bytes.Equal(b.buf[:4096], a.buf[:4096]) {
		t.Fatal("data differs")
	}
	if d := fabric.ReadStats().Sub(before); d.Posted != 0 || d.AVInserts != 0 {
		t.Fatalf("efa was used for a peer without efa: %+v", d)
	}
	// And the other way: the tcp-only engine reaches the efa one.
	segA := open(t, b, a)
	run(t, b.e, []engine.Request{{Op: engine.Read, Local: b.buf[8192:12288], Target: segA, TargetAddr: a.addr(0)}})
	if !bytes.Equal(b.buf[8192:12288], a.buf[:4096]) {
		t.Fatal("read data differs")
	}
}

// TestEngineWarmup: WarmupSegment connects before the first request.
func TestEngineWarmup(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	a := newEngine(t, 1<<20, efaConfig(prov))
	b := newEngine(t, 1<<20, efaConfig(prov))
	seg := open(t, a, b)
	before := fabric.ReadStats()
	if err := a.e.WarmupSegment(context.Background(), seg); err != nil {
		t.Fatal(err)
	}
	if d := fabric.ReadStats().Sub(before); d.AVInserts == 0 {
		t.Fatal("warm-up inserted no address")
	}
	mid := fabric.ReadStats()
	run(t, a.e, []engine.Request{{Op: engine.Write, Local: a.buf[:64], Target: seg, TargetAddr: b.addr(0)}})
	if d := fabric.ReadStats().Sub(mid); d.AVInserts != 0 || d.Posted == 0 {
		t.Fatalf("first request after warm-up: %+v", d)
	}
	if err := a.e.WarmupSegment(context.Background(), engine.SegmentID(12345)); !errors.Is(err, engine.ErrInvalidSegment) {
		t.Fatalf("warm-up of a bad handle: %v", err)
	}
}

// TestEnginePeerClosedMidBatch: the target engine closes under a batch of
// 128 1-MiB writes; every request ends FAILED or TIMEOUT by its deadline
// and the batch is freed soon after.
func TestEnginePeerClosedMidBatch(t *testing.T) {
	needFabric(t)
	for _, prov := range providers() {
		t.Run(prov, func(t *testing.T) {
			needProvider(t, prov)
			cfg := efaConfig(prov)
			cfg.TransferTimeout = 4 * time.Second
			cfg.EFA.StuckGrace = time.Second
			cfg.EFA.PeerTimeout = time.Second
			a := newEngine(t, 128<<20, cfg)
			bp, err := mempool.New(mempool.Options{Size: 128 << 20, SlabSize: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer bp.Close()
			bbuf, _ := bp.Alloc(128 << 20)
			bcfg := efaConfig(prov)
			bcfg.LocalServerName, bcfg.Logger = "127.0.0.1", quiet
			be, err := engine.New(bcfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := be.RegisterMemory(bbuf, "cpu:0"); err != nil {
				t.Fatal(err)
			}
			seg, err := a.e.OpenSegment(context.Background(), be.Name())
			if err != nil {
				t.Fatal(err)
			}
			reqs := make([]engine.Request, 128)
			for i := range reqs {
				reqs[i] = engine.Request{Op: engine.Write, Local: a.buf[i<<20 : (i+1)<<20], Target: seg, TargetAddr: transport.AddrOf(bbuf) + uint64(i<<20)}
			}
			bid, err := a.e.AllocateBatch(128)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := a.e.Submit(bid, reqs); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			if err := be.Close(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			st, _ := a.e.Wait(ctx, bid)
			el := time.Since(start)
			t.Logf("after %v: %d completed, %d failed, %d timed out; err %v", el, st.Completed, st.Failed, st.TimedOut, st.Err)
			if st.Pending != 0 || st.Completed+st.Failed+st.TimedOut != 128 {
				t.Fatalf("status %+v", st)
			}
			if el > cfg.TransferTimeout+2*time.Second {
				t.Fatalf("batch ended after %v, past its deadline", el)
			}
			for deadline := time.Now().Add(cfg.EFA.StuckGrace + 10*time.Second); ; {
				err := a.e.FreeBatch(bid)
				if err == nil {
					break
				}
				if !errors.Is(err, engine.ErrBatchBusy) || time.Now().After(deadline) {
					t.Fatalf("FreeBatch: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestEngineMissingLibrary: with libfabric impossible to load, an engine
// asked for efa then tcp starts with tcp only, and one asked for efa
// alone says no transport started. Runs in every build.
func TestEngineMissingLibrary(t *testing.T) {
	cfg := engine.Config{LocalServerName: "127.0.0.1", Logger: quiet, Protocols: []string{"efa", "tcp"},
		EFA: efa.Config{Provider: "tcp;ofi_rxm", Library: "/nonexistent/libfabric-missing.so.1"}}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Transports(); len(got) != 1 || got[0] != "tcp" {
		t.Fatalf("transports %v, want [tcp]", got)
	}
	e.Close()
	cfg.Protocols = []string{"efa"}
	if _, err := engine.New(cfg); !errors.Is(err, engine.ErrNoTransport) {
		t.Fatalf("efa alone: %v, want ErrNoTransport", err)
	}
	tr := efa.New(efa.Config{Library: "/nonexistent/libfabric-missing.so.1"})
	err = tr.Start(transport.Env{LocalName: "x:1", Host: "127.0.0.1", Registry: transport.NewRegistry(), Logger: quiet})
	if !errors.Is(err, transport.ErrNotSupported) {
		t.Fatalf("Start: %v, want ErrNotSupported", err)
	}
	if fabric.Built && !strings.Contains(err.Error(), "libfabric-missing.so.1") {
		t.Fatalf("Start error does not name the library: %v", err)
	}
	tr.Close()
}

// TestNotLinked: the binary does not link libfabric (it is opened at run
// time), so it starts on hosts without it.
func TestNotLinked(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Skipf("not an ELF binary: %v", err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range libs {
		if strings.Contains(l, "fabric") {
			t.Fatalf("binary links %s", l)
		}
	}
	t.Logf("linked: %v", libs)
}

// childEnv makes the test binary run runChild instead of the tests.
const childEnv = "CRESCENT_EFA_TEST_CHILD"

// runChild starts an engine preferring efa in a fresh process where
// MC_LIBFABRIC_PATH names a missing library, and prints its transports.
func runChild() {
	e, err := engine.New(engine.Config{LocalServerName: "127.0.0.1", Logger: quiet, Protocols: []string{"efa", "tcp"}, EFA: efa.Config{Provider: "tcp;ofi_rxm"}})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("transports:", strings.Join(e.Transports(), ","))
	tr := efa.New(efa.Config{})
	fmt.Println("efa:", tr.Start(transport.Env{LocalName: "x:1", Host: "127.0.0.1", Registry: transport.NewRegistry(), Logger: quiet}))
	e.Close()
	os.Exit(0)
}

// TestProcessWithoutLibrary runs a fresh process whose libfabric cannot
// be loaded ($MC_LIBFABRIC_PATH names a missing file): it starts, reports
// efa unavailable, and serves tcp.
func TestProcessWithoutLibrary(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", fabric.EnvLibrary+"=/nonexistent/libfabric.so.1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	s := string(out)
	if !strings.Contains(s, "transports: tcp\n") || !strings.Contains(s, "not supported") {
		t.Fatalf("child output:\n%s", s)
	}
	if fabric.Built && !strings.Contains(s, "/nonexistent/libfabric.so.1") {
		t.Fatalf("child does not name the missing library:\n%s", s)
	}
	t.Logf("child:\n%s", s)
}
