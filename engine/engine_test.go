package engine_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/testutil"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild()
		return
	}
	goleak.VerifyTestMain(m)
}

// node is an engine with one registered buffer from a memfd pool.
type node struct {
	e    *engine.Engine
	pool *mempool.Pool
	buf  []byte
}

func newNode(t testing.TB, size int, cfg engine.Config) *node {
	t.Helper()
	if cfg.LocalServerName == "" {
		cfg.LocalServerName = "127.0.0.1"
	}
	p, err := mempool.New(mempool.Options{Size: int64(size), SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := p.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg)
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	if err := e.RegisterMemory(buf, "cpu:0"); err != nil {
		t.Fatal(err)
	}
	n := &node{e: e, pool: p, buf: buf}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		p.Close()
	})
	return n
}

func (n *node) addr(off int) uint64 { return transport.AddrOf(n.buf) + uint64(off) }

func wait(t testing.TB, e *engine.Engine, b engine.BatchID) engine.BatchStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := e.Wait(ctx, b)
	if err != nil {
		t.Fatalf("wait: %v (%+v)", err, st)
	}
	return st
}

var protocols = []string{"tcp", "shm"}

func TestWriteReadRoundTrip(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			cfg := engine.Config{Protocols: []string{proto}}
			cfg.TCP.SliceSize = 256 << 10 // exercise slicing
			a := newNode(t, 16<<20, cfg)
			b := newNode(t, 16<<20, cfg)
			if got := a.e.Transports(); len(got) != 1 || got[0] != proto {
				t.Fatalf("transports %v", got)
			}
			seg, err := a.e.OpenSegment(context.Background(), b.e.Name())
			if err != nil {
				t.Fatal(err)
			}
			defer a.e.CloseSegment(seg)

			sizes := []int{1, 7, 4096, 65536, 1<<20 + 13, 3 << 20}
			testutil.Fill(a.buf[:8<<20], 1)
			var reqs []engine.Request
			off := 0
			for _, n := range sizes {
				reqs = append(reqs, engine.Request{Op: engine.Write, Local: a.buf[off : off+n], Target: seg, TargetAddr: b.addr(off + 100)})
				off += n + 4096
			}
			batch, err := a.e.AllocateBatch(len(reqs))
			if err != nil {
				t.Fatal(err)
			}
			if err := a.e.Submit(batch, reqs); err != nil {
				t.Fatal(err)
			}
			st := wait(t, a.e, batch)
			if st.Status != engine.Completed || st.Completed != len(reqs) {
				t.Fatalf("batch status %+v", st)
			}
			for i, r := range reqs {
				ts, err := a.e.Status(batch, i)
				if err != nil || ts.Status != engine.Completed || ts.Transferred != uint64(len(r.Local)) || ts.Latency <= 0 {
					t.Fatalf("request %d: %+v %v", i, ts, err)
				}
				o := int(r.TargetAddr - b.addr(0))
				if !bytes.Equal(b.buf[o:o+len(r.Local)], r.Local) {
					t.Fatalf("request %d: target bytes differ", i)
				}
			}
			if err := a.e.FreeBatch(batch); err != nil {
				t.Fatal(err)
			}

			// Read everything back into another region.
			back := a.buf[8<<20:]
			clear(back)
			reads := make([]engine.Request, len(reqs))
			roff := 0
			for i, r := range reqs {
				reads[i] = engine.Request{Op: engine.Read, Local: back[roff : roff+len(r.Local)], Target: seg, TargetAddr: r.TargetAddr}
				roff += len(r.Local)
			}
			batch, _ = a.e.AllocateBatch(len(reads))
			if err := a.e.Submit(batch, reads); err != nil {
				t.Fatal(err)
			}
			wait(t, a.e, batch)
			for i := range reads {
				if !bytes.Equal(reads[i].Local, reqs[i].Local) {
					t.Fatalf("read %d differs", i)
				}
			}
			a.e.FreeBatch(batch)
			if s := a.e.Stats(); s.Completed != uint64(2*len(reqs)) || s.Failed != 0 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

func TestBatchLifecycle(t *testing.T) {
	a := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	seg, err := a.e.OpenSegment(context.Background(), b.e.Name())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.e.AllocateBatch(0); !errors.Is(err, engine.ErrInvalidCapacity) {
		t.Fatalf("capacity 0: %v", err)
	}
	id, err := a.e.AllocateBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := a.e.BatchStatus(id); st.Status != engine.Waiting {
		t.Fatalf("fresh batch %v", st.Status)
	}
	if ts, _ := a.e.Status(id, 1); ts.Status != engine.Waiting {
		t.Fatalf("unsubmitted request %v", ts.Status)
	}
	if _, err := a.e.Status(id, 2); !errors.Is(err, engine.ErrInvalidIndex) {
		t.Fatalf("index 2: %v", err)
	}
	r := engine.Request{Op: engine.Write, Local: a.buf[:100], Target: seg, TargetAddr: b.addr(0)}
	if err := a.e.Submit(id, []engine.Request{r, r, r}); !errors.Is(err, engine.ErrBatchFull) {
		t.Fatalf("3 into 2: %v", err)
	}
	// Two Submit calls fill the batch.
	if err := a.e.Submit(id, []engine.Request{r}); err != nil {
		t.Fatal(err)
	}
	if err := a.e.Submit(id, []engine.Request{r}); err != nil {
		t.Fatal(err)
	}
	if err := a.e.Submit(id, []engine.Request{r}); !errors.Is(err, engine.ErrBatchFull) {
		t.Fatalf("third: %v", err)
	}
	st := wait(t, a.e, id)
	if st.Requests != 2 || st.Completed != 2 || st.Transferred != 200 {
		t.Fatalf("status %+v", st)
	}
	done, err := a.e.Done(id)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Fatal("done channel open after completion")
	}
	if err := a.e.FreeBatch(id); err != nil {
		t.Fatal(err)
	}
	// A freed handle, and a forged one, are refused everywhere.
	for _, bad := range []engine.BatchID{id, id + 1<<32, 0, 12345} {
		if err := a.e.Submit(bad, []engine.Request{r}); !errors.Is(err, engine.ErrInvalidBatch) {
			t.Fatalf("submit %#x: %v", bad, err)
		}
		if _, err := a.e.BatchStatus(bad); !errors.Is(err, engine.ErrInvalidBatch) {
			t.Fatalf("status %#x: %v", bad, err)
		}
		if err := a.e.FreeBatch(bad); !errors.Is(err, engine.ErrInvalidBatch) {
			t.Fatalf("free %#x: %v", bad, err)
		}
	}
	// The slot is reused under a new generation; the old handle stays dead.
	id2, _ := a.e.AllocateBatch(1)
	if id2 == id {
		t.Fatal("handle reused verbatim")
	}
	if _, err := a.e.BatchStatus(id); !errors.Is(err, engine.ErrInvalidBatch) {
		t.Fatalf("old handle after reuse: %v", err)
	}
	a.e.FreeBatch(id2)
}

func TestBadInput(t *testing.T) {
	a := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	ctx := context.Background()
	seg, err := a.e.OpenSegment(ctx, b.e.Name())
	if err != nil {
		t.Fatal(err)
	}
	unregistered := make([]byte, 64)
	ok := engine.Request{Op: engine.Write, Local: a.buf[:64], Target: seg, TargetAddr: b.addr(0)}
	cases := []struct {
		name string
		mod  func(r *engine.Request)
		want error
	}{
		{"local not registered", func(r *engine.Request) { r.Local = unregistered }, engine.ErrNotRegistered},
		// Validation refuses it before any byte past the buffer is touched.
		{"local runs past its buffer", func(r *engine.Request) { r.Local = unsafe.Slice(&a.buf[len(a.buf)-10], 64) }, engine.ErrNotRegistered},
		{"target below buffer", func(r *engine.Request) { r.TargetAddr = b.addr(0) - 1 }, engine.ErrOutOfBounds},
		{"target past buffer end", func(r *engine.Request) { r.TargetAddr = b.addr(len(b.buf) - 63) }, engine.ErrOutOfBounds},
		{"target address 0", func(r *engine.Request) { r.TargetAddr = 0 }, engine.ErrOutOfBounds},
		{"zero length", func(r *engine.Request) { r.Local = a.buf[:0] }, engine.ErrZeroLength},
		{"overflowing length", func(r *engine.Request) { r.TargetAddr = ^uint64(0) - 10 }, engine.ErrLengthOverflow},
		{"bad opcode", func(r *engine.Request) { r.Op = 7 }, engine.ErrInvalidOp},
		{"unknown segment handle", func(r *engine.Request) { r.Target = seg + 1<<32 }, engine.ErrInvalidSegment},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, _ := a.e.AllocateBatch(2)
			defer a.e.FreeBatch(id)
			bad := ok
			c.mod(&bad)
			// The good request before the bad one must not start either.
			err := a.e.Submit(id, []engine.Request{ok, bad})
			var re *engine.RequestError
			if !errors.Is(err, c.want) || !errors.As(err, &re) || re.Index != 1 {
				t.Fatalf("got %v, want %v at index 1", err, c.want)
			}
			if st, _ := a.e.BatchStatus(id); st.Status != engine.Waiting || st.Requests != 0 {
				t.Fatalf("refused submit changed the batch: %+v", st)
			}
		})
	}
	if _, err := a.e.OpenSegment(ctx, "127.0.0.1:1"); !errors.Is(err, engine.ErrSegmentNotFound) {
		t.Fatalf("unknown segment: %v", err)
	}
	if _, err := a.e.OpenSegment(ctx, "no-port"); !errors.Is(err, engine.ErrSegmentNotFound) {
		t.Fatalf("malformed segment name: %v", err)
	}
	if err := a.e.RegisterMemory(a.buf[10:20], ""); !errors.Is(err, engine.ErrAlreadyRegistered) {
		t.Fatalf("overlapping registration: %v", err)
	}
	if err := a.e.RegisterMemory(nil, ""); err == nil {
		t.Fatal("empty registration accepted")
	}
	if err := a.e.UnregisterMemory(ctx, unregistered); !errors.Is(err, engine.ErrNotRegistered) {
		t.Fatalf("unregister unknown: %v", err)
	}
	if err := a.e.CloseSegment(seg); err != nil {
		t.Fatal(err)
	}
	if err := a.e.CloseSegment(seg); !errors.Is(err, engine.ErrInvalidSegment) {
		t.Fatalf("double close: %v", err)
	}
	id, _ := a.e.AllocateBatch(1)
	if err := a.e.Submit(id, []engine.Request{ok}); !errors.Is(err, engine.ErrInvalidSegment) {
		t.Fatalf("closed segment: %v", err)
	}
	if _, err := engine.New(engine.Config{Protocols: []string{"carrier-pigeon"}, LocalServerName: "127.0.0.1"}); !errors.Is(err, engine.ErrInvalidConfig) {
		t.Fatalf("unknown protocol: %v", err)
	}
	if _, err := engine.New(engine.Config{LocalServerName: "127.0.0.1:http"}); !errors.Is(err, engine.ErrInvalidConfig) {
		t.Fatalf("bad port: %v", err)
	}
}

func TestClosedEngine(t *testing.T) {
	p, _ := mempool.New(mempool.Options{Size: 1 << 20, SlabSize: 1 << 20})
	defer p.Close()
	buf, _ := p.Alloc(4096)
	e, err := engine.New(engine.Config{LocalServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	e.RegisterMemory(buf, "")
	id, _ := e.AllocateBatch(1)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := e.AllocateBatch(1); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("allocate: %v", err)
	}
	if err := e.Submit(id, nil); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("submit: %v", err)
	}
	if _, err := e.OpenSegment(context.Background(), "127.0.0.1:1"); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("open: %v", err)
	}
	if err := e.RegisterMemory(buf, ""); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("register: %v", err)
	}
}

func TestNotify(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			a := newNode(t, 1<<20, engine.Config{Protocols: []string{proto}})
			b := newNode(t, 1<<20, engine.Config{Protocols: []string{proto}})
			seg, _ := a.e.OpenSegment(context.Background(), b.e.Name())
			id, _ := a.e.AllocateBatch(4)
			reqs := []engine.Request{
				{Op: engine.Write, Local: a.buf[:4096], Target: seg, TargetAddr: b.addr(0)},
				{Op: engine.Write, Local: a.buf[4096:8192], Target: seg, TargetAddr: b.addr(4096)},
			}
			if err := a.e.SubmitWithNotify(id, reqs, seg, "layer-7 done"); err != nil {
				t.Fatal(err)
			}
			st := wait(t, a.e, id)
			if st.NotifyErr != nil {
				t.Fatal(st.NotifyErr)
			}
			// Wait returns after delivery, so the target has it now.
			got := b.e.Notifications()
			if len(got) != 1 || got[0].Msg != "layer-7 done" || got[0].From != a.e.Name() {
				t.Fatalf("notifications %+v", got)
			}
			if again := b.e.Notifications(); len(again) != 0 {
				t.Fatalf("not drained: %+v", again)
			}
			a.e.FreeBatch(id)

			// A batch that fails sends nothing.
			id, _ = a.e.AllocateBatch(1)
			b.e.UnregisterMemory(context.Background(), b.buf)
			bad := []engine.Request{{Op: engine.Write, Local: a.buf[:64], Target: seg, TargetAddr: b.addr(0)}}
			err := a.e.SubmitWithNotify(id, bad, seg, "never")
			if err == nil {
				_, err = a.e.Wait(context.Background(), id)
			}
			if err == nil {
				t.Fatal("write to an unregistered buffer succeeded")
			}
			if got := b.e.Notifications(); len(got) != 0 {
				t.Fatalf("failed batch notified: %+v", got)
			}
		})
	}
}

func TestConcurrentSubmitters(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			a := newNode(t, 8<<20, engine.Config{Protocols: []string{proto}})
			b := newNode(t, 8<<20, engine.Config{Protocols: []string{proto}})
			testutil.Fill(a.buf, 7)
			const workers, rounds, block = 8, 20, 16 << 10
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					seg, err := a.e.OpenSegment(context.Background(), b.e.Name())
					if err != nil {
						errs <- err
						return
					}
					defer a.e.CloseSegment(seg)
					for r := 0; r < rounds; r++ {
						id, _ := a.e.AllocateBatch(8)
						var reqs []engine.Request
						for i := 0; i < 8; i++ {
							off := ((w*8 + i) * block) % (len(a.buf) - block)
							op := engine.Write
							if r%2 == 1 {
								op = engine.Read
							}
							reqs = append(reqs, engine.Request{Op: op, Local: a.buf[off : off+block], Target: seg, TargetAddr: b.addr(off)})
						}
						if err := a.e.Submit(id, reqs); err != nil {
							errs <- err
							return
						}
						if _, err := a.e.Wait(context.Background(), id); err != nil {
							errs <- err
							return
						}
						if err := a.e.FreeBatch(id); err != nil {
							errs <- err
							return
						}
					}
				}(w)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
		})
	}
}

func TestWaitDeadlineAndCancel(t *testing.T) {
	a := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}, TransferTimeout: 2 * time.Second})
	stall := newStallingTarget(t)
	seg, err := a.e.OpenSegment(context.Background(), stall.name)
	if err != nil {
		t.Fatal(err)
	}
	defer a.e.CloseSegment(seg)
	req := engine.Request{Op: engine.Read, Local: a.buf[:4096], Target: seg, TargetAddr: stall.base}

	id, _ := a.e.AllocateBatch(1)
	a.e.Submit(id, []engine.Request{req})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	st, err := a.e.Wait(ctx, id)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || st.Status != engine.Timeout {
		t.Fatalf("deadline: %v %+v", err, st)
	}
	// The transport still owns the request until its own deadline.
	if err := a.e.FreeBatch(id); !errors.Is(err, engine.ErrBatchBusy) {
		t.Fatalf("free while in flight: %v", err)
	}
	eventually(t, 10*time.Second, func() bool { return a.e.FreeBatch(id) == nil })

	id, _ = a.e.AllocateBatch(1)
	a.e.Submit(id, []engine.Request{req})
	ctx, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	st, err = a.e.Wait(ctx, id)
	if !errors.Is(err, context.Canceled) || st.Status != engine.Canceled {
		t.Fatalf("cancel: %v %+v", err, st)
	}
	eventually(t, 10*time.Second, func() bool { return a.e.FreeBatch(id) == nil })

	// Without a Wait deadline, the engine's TransferTimeout ends it.
	id, _ = a.e.AllocateBatch(1)
	a.e.Submit(id, []engine.Request{req})
	st, err = a.e.Wait(context.Background(), id)
	if err == nil || st.Status != engine.Timeout {
		t.Fatalf("transfer timeout: %v %+v", err, st)
	}
	eventually(t, 10*time.Second, func() bool { return a.e.FreeBatch(id) == nil })
}

func eventually(t testing.TB, d time.Duration, f func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !f() {
		if time.Now().After(end) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRegisterAfterOpenRefreshes(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			a := newNode(t, 1<<20, engine.Config{Protocols: []string{proto}})
			b := newNode(t, 1<<20, engine.Config{Protocols: []string{proto}})
			seg, _ := a.e.OpenSegment(context.Background(), b.e.Name())
			// b registers a second buffer after a opened it.
			p2, _ := mempool.New(mempool.Options{Size: 1 << 20, SlabSize: 1 << 20})
			defer p2.Close()
			extra, _ := p2.Alloc(1 << 20)
			if err := b.e.RegisterMemory(extra, ""); err != nil {
				t.Fatal(err)
			}
			testutil.Fill(a.buf[:1000], 3)
			id, _ := a.e.AllocateBatch(1)
			err := a.e.Submit(id, []engine.Request{{Op: engine.Write, Local: a.buf[:1000], Target: seg, TargetAddr: transport.AddrOf(extra) + 5}})
			if err != nil {
				t.Fatalf("submit to a newly registered buffer: %v", err)
			}
			wait(t, a.e, id)
			a.e.FreeBatch(id)
			if !bytes.Equal(extra[5:1005], a.buf[:1000]) {
				t.Fatal("bytes did not land")
			}
			// Withdrawn again: the next request is refused, not written.
			if err := b.e.UnregisterMemory(context.Background(), extra); err != nil {
				t.Fatal(err)
			}
			id, _ = a.e.AllocateBatch(1)
			err = a.e.Submit(id, []engine.Request{{Op: engine.Write, Local: a.buf[:10], Target: seg, TargetAddr: transport.AddrOf(extra)}})
			if err == nil {
				st, werr := a.e.Wait(context.Background(), id)
				if werr == nil {
					t.Fatalf("write to an unregistered buffer completed: %+v", st)
				}
			} else if !errors.Is(err, engine.ErrOutOfBounds) {
				t.Fatalf("submit after unregister: %v", err)
			}
			eventually(t, 10*time.Second, func() bool { return a.e.FreeBatch(id) == nil })
		})
	}
}

func TestFdAndGoroutineHygiene(t *testing.T) {
	before := countFDs(t)
	for i := 0; i < 3; i++ {
		func() {
			a := newNodeNoCleanup(t, 1<<20, engine.Config{})
			b := newNodeNoCleanup(t, 1<<20, engine.Config{})
			seg, err := a.e.OpenSegment(context.Background(), b.e.Name())
			if err != nil {
				t.Fatal(err)
			}
			for _, op := range []engine.OpCode{engine.Write, engine.Read} {
				id, _ := a.e.AllocateBatch(1)
				a.e.Submit(id, []engine.Request{{Op: op, Local: a.buf[:8192], Target: seg, TargetAddr: b.addr(0)}})
				wait(t, a.e, id)
				a.e.FreeBatch(id)
			}
			a.close(t)
			b.close(t)
		}()
	}
	if after := countFDs(t); after > before {
		t.Fatalf("fds leaked: %d before, %d after", before, after)
	}
}

func newNodeNoCleanup(t testing.TB, size int, cfg engine.Config) *node {
	cfg.LocalServerName = "127.0.0.1"
	p, err := mempool.New(mempool.Options{Size: int64(size), SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := p.Alloc(size)
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterMemory(buf, ""); err != nil {
		t.Fatal(err)
	}
	return &node{e: e, pool: p, buf: buf}
}

func (n *node) close(t testing.TB) {
	if err := n.e.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	n.pool.Close()
}

func countFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestPeriodicSegmentRefresh(t *testing.T) {
	a := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}, SegmentRefresh: 20 * time.Millisecond})
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	seg, err := a.e.OpenSegment(context.Background(), b.e.Name())
	if err != nil {
		t.Fatal(err)
	}
	d, _ := a.e.SegmentDesc(seg)
	if len(d.Buffers) != 1 {
		t.Fatalf("buffers %+v", d.Buffers)
	}
	if err := b.e.UnregisterMemory(context.Background(), b.buf); err != nil {
		t.Fatal(err)
	}
	// No request touches the segment: only the refresher can notice.
	eventually(t, 10*time.Second, func() bool {
		d, _ := a.e.SegmentDesc(seg)
		return len(d.Buffers) == 0
	})
}
