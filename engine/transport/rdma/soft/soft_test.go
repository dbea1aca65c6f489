package soft_test

import (
	"context"
	"errors"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rw = rdmadev.AccessLocalWrite | rdmadev.AccessRemoteWrite | rdmadev.AccessRemoteRead

// side is one NIC with a PD, a CQ, a QP and 1 MiB of registered mmap'ed
// memory.
type side struct {
	dev *soft.Device
	pd  rdmadev.PD
	cq  rdmadev.CQ
	qp  rdmadev.QP
	mem []byte
	mr  rdmadev.MR
}

func newSide(t *testing.T, f *soft.Fabric, name string, access rdmadev.Access) *side {
	t.Helper()
	s := &side{dev: f.NewDevice(name, soft.Options{})}
	t.Cleanup(func() {
		if err := s.dev.Close(); err != nil {
			t.Error(err)
		}
	})
	var err error
	if s.mem, err = unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(s.mem) })
	if s.pd, err = s.dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.cq, err = s.dev.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if s.qp, err = s.pd.CreateQP(s.cq, rdmadev.QPCaps{MaxSendWR: 16, MaxSendSGE: 1}); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = s.pd.RegMR(s.mem, access); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.release(t) })
	return s
}

// release closes everything in the order a transport does.
func (s *side) release(t *testing.T) {
	s.qp.Close()
	s.mr.Close()
	if err := s.cq.Close(); err != nil && !errors.Is(err, rdmadev.ErrClosed) {
		t.Error(err)
	}
	if err := s.pd.Close(); err != nil && !errors.Is(err, rdmadev.ErrClosed) {
		t.Error(err)
	}
}

func (s *side) addr(off int) uint64 { return uint64(uintptr(unsafe.Pointer(&s.mem[off]))) }

func connect(t *testing.T, a, b *side, access rdmadev.Access) {
	t.Helper()
	for _, p := range [][2]*side{{a, b}, {b, a}} {
		x, y := p[0], p[1]
		if err := x.qp.ToInit(1, access); err != nil {
			t.Fatal(err)
		}
		if err := x.qp.ToRTR(rdmadev.RTRAttr{Port: 1, PathMTU: 4096, DestQPN: y.qp.Num(), DestGID: y.dev.GID(), Global: true}); err != nil {
			t.Fatal(err)
		}
		if err := x.qp.ToRTS(rdmadev.RTSAttr{Timeout: 14, RetryCount: 7, RNRRetry: 7}); err != nil {
			t.Fatal(err)
		}
	}
}

func pair(t *testing.T) (*side, *side) {
	f := soft.NewFabric()
	a, b := newSide(t, f, "a", rw), newSide(t, f, "b", rw)
	connect(t, a, b, rw)
	return a, b
}

// poll waits for n completions.
func poll(t *testing.T, s *side, n int) []rdmadev.Completion {
	t.Helper()
	var out []rdmadev.Completion
	buf := make([]rdmadev.Completion, 16)
	deadline := time.Now().Add(10 * time.Second)
	for len(out) < n {
		k, err := s.cq.Poll(buf)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, buf[:k]...)
		if k == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d completions", len(out), n)
			}
			s.cq.Arm()
			if k, _ = s.cq.Poll(buf); k > 0 {
				out = append(out, buf[:k]...)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			s.cq.Wait(ctx)
			cancel()
		}
	}
	return out
}

func wr(id uint64, op rdmadev.Opcode, a *side, aoff int, b *side, boff int, n uint32) rdmadev.SendWR {
	return rdmadev.SendWR{ID: id, Op: op, Local: a.addr(aoff), Length: n, LKey: a.mr.LKey(), Remote: b.addr(boff), RKey: b.mr.RKey()}
}

func TestWriteReadInOrder(t *testing.T) {
	a, b := pair(t)
	for i := range 4096 {
		a.mem[i] = byte(i)
		b.mem[8192+i] = byte(i * 7)
	}
	n, err := a.qp.PostSend([]rdmadev.SendWR{
		wr(1, rdmadev.OpWrite, a, 0, b, 4096, 4096),
		wr(2, rdmadev.OpRead, a, 65536, b, 8192, 4096),
		wr(3, rdmadev.OpWrite, a, 0, b, 0, 0),
	})
	if n != 3 || err != nil {
		t.Fatal(n, err)
	}
	wcs := poll(t, a, 3)
	for i, wc := range wcs {
		if wc.ID != uint64(i+1) || wc.Status != rdmadev.WCSuccess || wc.QPN != a.qp.Num() {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if wcs[0].Bytes != 4096 || wcs[1].Op != rdmadev.OpRead {
		t.Fatalf("%+v", wcs)
	}
	for i := range 4096 {
		if b.mem[4096+i] != byte(i) || a.mem[65536+i] != byte(i*7) {
			t.Fatalf("byte %d", i)
		}
	}
	if s := a.dev.Stats(); s.PostCalls != 1 || s.PostedWRs != 3 || s.Executed != 3 || s.Bytes != 8192 {
		t.Fatalf("stats %+v", s)
	}
	if s := b.dev.Stats(); s.PostCalls != 0 || s.Executed != 0 {
		t.Fatalf("responder did work: %+v", s)
	}
}

// TestAccessChecks: what a real HCA refuses, the software device
// refuses, with the same status, the QP going to ERR and what follows it
// flushed.
func TestAccessChecks(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mrAccess rdmadev.Access
		qpAccess rdmadev.Access
		mut      func(a, b *side, w *rdmadev.SendWR)
		want     rdmadev.WCStatus
		respErr  bool
	}{
		{"wrong rkey", rw, rw, func(a, b *side, w *rdmadev.SendWR) { w.RKey++ }, rdmadev.WCRemAccessErr, true},
		{"lkey as rkey", rw, rw, func(a, b *side, w *rdmadev.SendWR) { w.RKey = b.mr.LKey() }, rdmadev.WCRemAccessErr, true},
		{"past the region", rw, rw, func(a, b *side, w *rdmadev.SendWR) { w.Remote = b.addr(1<<20 - 100) }, rdmadev.WCRemAccessErr, true},
		{"before the region", rw, rw, func(a, b *side, w *rdmadev.SendWR) { w.Remote = b.addr(0) - 1 }, rdmadev.WCRemAccessErr, true},
		{"region without remote write", rdmadev.AccessLocalWrite | rdmadev.AccessRemoteRead, rw, nil, rdmadev.WCRemAccessErr, true},
		{"QP without remote write", rw, rdmadev.AccessLocalWrite | rdmadev.AccessRemoteRead, nil, rdmadev.WCRemInvReqErr, true},
		{"wrong lkey", rw, rw, func(a, b *side, w *rdmadev.SendWR) { w.LKey = a.mr.RKey() }, rdmadev.WCLocProtErr, false},
		{"local past the region", rw, rw, func(a, b *side, w *rdmadev.SendWR) { w.Local = a.addr(1<<20 - 1) }, rdmadev.WCLocProtErr, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := soft.NewFabric()
			a, b := newSide(t, f, "a", rw), newSide(t, f, "b", tc.mrAccess)
			connect(t, a, b, tc.qpAccess)
			w := wr(1, rdmadev.OpWrite, a, 0, b, 0, 4096)
			if tc.mut != nil {
				tc.mut(a, b, &w)
			}
			if _, err := a.qp.PostSend([]rdmadev.SendWR{w, wr(2, rdmadev.OpWrite, a, 0, b, 0, 16)}); err != nil {
				t.Fatal(err)
			}
			wcs := poll(t, a, 2)
			if wcs[0].Status != tc.want || wcs[1].Status != rdmadev.WCWRFlushErr {
				t.Fatalf("statuses %v, %v", wcs[0].Status, wcs[1].Status)
			}
			if st, _ := a.qp.State(); st != rdmadev.QPError {
				t.Fatalf("requester QP %v", st)
			}
			if st, _ := b.qp.State(); (st == rdmadev.QPError) != tc.respErr {
				t.Fatalf("responder QP %v", st)
			}
			// An ERR QP still takes posts and flushes them.
			if _, err := a.qp.PostSend([]rdmadev.SendWR{wr(3, rdmadev.OpWrite, a, 0, b, 0, 16)}); err != nil {
				t.Fatal(err)
			}
			if wc := poll(t, a, 1)[0]; wc.ID != 3 || wc.Status != rdmadev.WCWRFlushErr {
				t.Fatalf("%+v", wc)
			}
		})
	}
}

func TestTransitions(t *testing.T) {
	f := soft.NewFabric()
	a, b := newSide(t, f, "a", rw), newSide(t, f, "b", rw)
	if _, err := a.qp.PostSend([]rdmadev.SendWR{{ID: 1}}); !errors.Is(err, rdmadev.ErrBadState) {
		t.Fatalf("post in RESET: %v", err)
	}
	if err := a.qp.ToRTR(rdmadev.RTRAttr{PathMTU: 1024, DestQPN: 1, DestGID: b.dev.GID(), Global: true}); !errors.Is(err, rdmadev.ErrBadState) {
		t.Fatalf("RTR from RESET: %v", err)
	}
	if err := a.qp.ToInit(2, rw); !errors.Is(err, rdmadev.ErrInvalid) {
		t.Fatalf("INIT on port 2: %v", err)
	}
	if err := a.qp.ToInit(1, rw); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []rdmadev.RTRAttr{
		{PathMTU: 1500, DestQPN: 1, DestGID: b.dev.GID(), Global: true},
		{PathMTU: 4096, DestQPN: 0, DestGID: b.dev.GID(), Global: true},
		{PathMTU: 4096, DestQPN: 1, Global: true},
		{PathMTU: 4096, DestQPN: 1, DestLID: 3}, // RoCE needs a GRH
	} {
		if err := a.qp.ToRTR(bad); !errors.Is(err, rdmadev.ErrInvalid) {
			t.Fatalf("RTR %+v: %v", bad, err)
		}
	}
	// A port MTU of 1024 refuses a 4096 path.
	small := f.NewDevice("small", soft.Options{MTU: 1024})
	defer small.Close()
	pd, _ := small.AllocPD()
	cq, _ := small.CreateCQ(4)
	q, _ := pd.CreateQP(cq, rdmadev.QPCaps{MaxSendWR: 1, MaxSendSGE: 1})
	q.ToInit(1, rw)
	if err := q.ToRTR(rdmadev.RTRAttr{PathMTU: 4096, DestQPN: 1, DestGID: b.dev.GID(), Global: true}); !errors.Is(err, rdmadev.ErrInvalid) {
		t.Fatalf("RTR above port MTU: %v", err)
	}
	if err := cq.Close(); err == nil {
		t.Fatal("closed a CQ with a QP")
	}
	if err := pd.Close(); err == nil {
		t.Fatal("closed a PD with a QP")
	}
	q.Close()
	cq.Close()
	pd.Close()
	if l := small.Live(); l != (soft.Live{}) {
		t.Fatalf("live %+v", l)
	}
}

func TestQueueFull(t *testing.T) {
	a, b := pair(t)
	remove := a.dev.Inject(soft.Fault{Kind: soft.FaultHang})
	wrs := make([]rdmadev.SendWR, 20)
	for i := range wrs {
		wrs[i] = wr(uint64(i), rdmadev.OpWrite, a, 0, b, 0, 8)
	}
	n, err := a.qp.PostSend(wrs)
	if n != 16 || !errors.Is(err, rdmadev.ErrQueueFull) {
		t.Fatalf("PostSend = %d, %v", n, err)
	}
	remove()
	if got := poll(t, a, 16); got[15].ID != 15 {
		t.Fatal(got[15])
	}
}

func TestFaults(t *testing.T) {
	t.Run("error", func(t *testing.T) {
		a, b := pair(t)
		a.dev.Inject(soft.Fault{Kind: soft.FaultError, Count: 1, Status: rdmadev.WCRNRRetryExcErr})
		a.qp.PostSend([]rdmadev.SendWR{wr(1, rdmadev.OpWrite, a, 0, b, 0, 8), wr(2, rdmadev.OpWrite, a, 0, b, 0, 8)})
		wcs := poll(t, a, 2)
		if wcs[0].Status != rdmadev.WCRNRRetryExcErr || wcs[1].Status != rdmadev.WCWRFlushErr {
			t.Fatalf("%+v", wcs)
		}
	})
	t.Run("drop", func(t *testing.T) {
		a, b := pair(t)
		a.mem[0] = 42
		a.dev.Inject(soft.Fault{Kind: soft.FaultDrop, Count: 1})
		a.qp.PostSend([]rdmadev.SendWR{wr(1, rdmadev.OpWrite, a, 0, b, 0, 8), wr(2, rdmadev.OpWrite, a, 0, b, 100, 8)})
		wcs := poll(t, a, 1)
		if wcs[0].ID != 2 || b.mem[0] != 42 || a.dev.Stats().Dropped != 1 {
			t.Fatalf("%+v", wcs)
		}
	})
	t.Run("delay", func(t *testing.T) {
		a, b := pair(t)
		a.dev.Inject(soft.Fault{Kind: soft.FaultDelay, Delay: 60 * time.Millisecond, Count: 1})
		start := time.Now()
		a.qp.PostSend([]rdmadev.SendWR{wr(1, rdmadev.OpWrite, a, 0, b, 0, 8), wr(2, rdmadev.OpWrite, a, 0, b, 0, 8)})
		wcs := poll(t, a, 2)
		if time.Since(start) < 60*time.Millisecond || wcs[0].ID != 1 || wcs[1].ID != 2 {
			t.Fatalf("%+v after %v", wcs, time.Since(start))
		}
	})
	t.Run("hang then reset", func(t *testing.T) {
		a, b := pair(t)
		remove := a.dev.Inject(soft.Fault{Kind: soft.FaultHang})
		b.mem[0] = 1
		a.mem[0] = 2
		a.qp.PostSend([]rdmadev.SendWR{wr(1, rdmadev.OpWrite, a, 0, b, 0, 8)})
		a.qp.SetError() // a hung QP does not even flush
		if err := a.qp.Reset(); err != nil {
			t.Fatal(err)
		}
		remove()
		time.Sleep(20 * time.Millisecond) // give a wrong worker time to act; the check below must hold regardless
		if k, _ := a.cq.Poll(make([]rdmadev.Completion, 4)); k != 0 || b.mem[0] != 1 {
			t.Fatalf("reset QP completed %d / touched memory", k)
		}
		if st, _ := a.qp.State(); st != rdmadev.QPReset {
			t.Fatal(st)
		}
	})
	t.Run("async QP error", func(t *testing.T) {
		a, b := pair(t)
		a.dev.Inject(soft.Fault{Kind: soft.FaultDelay, Delay: time.Hour})
		a.qp.PostSend([]rdmadev.SendWR{wr(1, rdmadev.OpWrite, a, 0, b, 0, 8)})
		if err := a.dev.ErrorQP(a.qp.Num()); err != nil {
			t.Fatal(err)
		}
		if wc := poll(t, a, 1)[0]; wc.Status != rdmadev.WCWRFlushErr {
			t.Fatal(wc)
		}
		if err := a.dev.ErrorQP(0xdead); err == nil {
			t.Fatal("unknown QP")
		}
	})
	t.Run("port down", func(t *testing.T) {
		a, b := pair(t)
		b.dev.SetPortState(rdmadev.PortDown)
		if pi, _ := b.dev.QueryPort(1); pi.State != rdmadev.PortDown {
			t.Fatal(pi.State)
		}
		a.qp.PostSend([]rdmadev.SendWR{wr(1, rdmadev.OpWrite, a, 0, b, 0, 8)})
		if wc := poll(t, a, 1)[0]; wc.Status != rdmadev.WCRetryExcErr {
			t.Fatal(wc)
		}
	})
	t.Run("peer QP gone", func(t *testing.T) {
		a, b := pair(t)
		b.qp.Close()
		a.qp.PostSend([]rdmadev.SendWR{wr(1, rdmadev.OpWrite, a, 0, b, 0, 8)})
		if wc := poll(t, a, 1)[0]; wc.Status != rdmadev.WCRetryExcErr {
			t.Fatal(wc)
		}
	})
}

// TestMRCloseRevokes: after MR.Close the region is unreachable.
func TestMRCloseRevokes(t *testing.T) {
	a, b := pair(t)
	if err := b.mr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.mr.Close(); !errors.Is(err, rdmadev.ErrClosed) {
		t.Fatal(err)
	}
	a.qp.PostSend([]rdmadev.SendWR{wr(1, rdmadev.OpWrite, a, 0, b, 0, 8)})
	if wc := poll(t, a, 1)[0]; wc.Status != rdmadev.WCRemAccessErr {
		t.Fatal(wc)
	}
}

func TestCQOverrun(t *testing.T) {
	f := soft.NewFabric()
	a, b := newSide(t, f, "a", rw), newSide(t, f, "b", rw)
	small, _ := a.dev.CreateCQ(2)
	q, _ := a.pd.CreateQP(small, rdmadev.QPCaps{MaxSendWR: 8, MaxSendSGE: 1})
	defer func() { q.Close(); small.Close() }()
	bq, _ := b.pd.CreateQP(b.cq, rdmadev.QPCaps{MaxSendWR: 8, MaxSendSGE: 1})
	defer bq.Close()
	q.ToInit(1, rw)
	q.ToRTR(rdmadev.RTRAttr{PathMTU: 4096, DestQPN: bq.Num(), DestGID: b.dev.GID(), Global: true})
	q.ToRTS(rdmadev.RTSAttr{})
	bq.ToInit(1, rw)
	bq.ToRTR(rdmadev.RTRAttr{PathMTU: 4096, DestQPN: q.Num(), DestGID: a.dev.GID(), Global: true})
	wrs := make([]rdmadev.SendWR, 4)
	for i := range wrs {
		wrs[i] = wr(uint64(i), rdmadev.OpWrite, a, 0, b, 0, 8)
	}
	q.PostSend(wrs)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := small.Poll(make([]rdmadev.Completion, 1))
		if errors.Is(err, rdmadev.ErrCQOverrun) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no overrun")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCloseReportsLiveObjects(t *testing.T) {
	f := soft.NewFabric()
	d := f.NewDevice("x", soft.Options{})
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(4)
	pd.CreateQP(cq, rdmadev.QPCaps{MaxSendWR: 1, MaxSendSGE: 1})
	if err := d.Close(); !errors.Is(err, soft.ErrLiveObjects) {
		t.Fatalf("Close = %v", err)
	}
	if _, err := d.AllocPD(); !errors.Is(err, rdmadev.ErrClosed) {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := cq.Wait(ctx); !errors.Is(err, rdmadev.ErrClosed) {
		t.Fatalf("Wait on a closed device's CQ: %v", err)
	}
}

func TestInfoAndStats(t *testing.T) {
	f := soft.NewFabric()
	d := f.NewDevice("mlx5_0", soft.Options{NUMANode: 1, MTU: 2048})
	defer d.Close()
	ib := f.NewDevice("ib0", soft.Options{LinkLayer: rdmadev.LinkInfiniBand})
	defer ib.Close()
	info := d.Info()
	if info.Name != "mlx5_0" || info.NUMANode != 1 || len(info.Ports) != 1 || info.Ports[0].ActiveMTU != 2048 ||
		info.Ports[0].State != rdmadev.PortActive || !info.Ports[0].GID.IPv4Mapped() || info.Ports[0].LID != 0 {
		t.Fatalf("%+v", info)
	}
	if p := ib.Info().Ports[0]; p.LID == 0 || p.LinkLayer != rdmadev.LinkInfiniBand {
		t.Fatalf("%+v", p)
	}
	if _, err := d.QueryPort(2); !errors.Is(err, rdmadev.ErrInvalid) {
		t.Fatal(err)
	}
	s := soft.Stats{PostCalls: 1, PollCalls: 2, ArmCalls: 3, WaitCalls: 4}
	if s.HotCalls() != 10 || s.Add(s).Sub(s) != s {
		t.Fatal("stats arithmetic")
	}
}
