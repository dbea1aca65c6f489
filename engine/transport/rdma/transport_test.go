package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma"
	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
	"github.com/crescent-kv/crescent/internal/testutil"
)

func TestWriteReadRoundTrip(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{})
	b := newNode(t, f, nodeOpts{})
	for _, size := range []int{1, 7, 4095, 4096, 65535, 65536, 65537, 1<<20 + 123} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			testutil.Fill(a.buf[:size], uint64(size))
			transfer(t, a, b.peer(), transport.Write, 0, size, b.addr(4096))
			mustEqual(t, "write", b.buf[4096:4096+size], a.buf[:size])
			testutil.Fill(b.buf[2<<20:2<<20+size], uint64(size)+1)
			transfer(t, a, b.peer(), transport.Read, 3<<20, size, b.addr(2<<20))
			mustEqual(t, "read", a.buf[3<<20:3<<20+size], b.buf[2<<20:2<<20+size])
		})
	}
}

// TestSlicingAcrossNICsAndQPs checks that a large request is cut into
// 64 KiB work requests spread over both NIC pairs and both QPs of each
// endpoint, posted in O(1) calls.
func TestSlicingAcrossNICsAndQPs(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2})
	b := newNode(t, f, nodeOpts{nics: 2})
	const size = 4 << 20
	testutil.Fill(a.buf[:size], 3)
	before := a.devStats()
	transfer(t, a, b.peer(), transport.Write, 0, size, b.addr(0))
	mustEqual(t, "write", b.buf[:size], a.buf[:size])
	d := a.devStats().Sub(before)
	if d.PostedWRs != size/(64<<10) {
		t.Fatalf("posted %d work requests, want %d slices of 64 KiB", d.PostedWRs, size/(64<<10))
	}
	for i, dev := range a.devs {
		if got := qpsUsed(dev); got != 2 {
			t.Errorf("NIC %d: %d QPs carried work, want 2", i, got)
		}
	}
	// 2 endpoints x 2 QPs: one post each.
	if d.PostCalls > 4 {
		t.Errorf("%d PostSend calls for one request of 64 slices", d.PostCalls)
	}
	if st := b.devStats(); st.PostCalls != 0 || st.PollCalls == 0 {
		// One-sided: the target posts nothing (it polls its own CQ).
		t.Errorf("target device calls: %+v", st)
	}
	if s := a.tr.Stats(); s.Endpoints != 2 || s.SlicesCompleted != size/(64<<10) {
		t.Errorf("stats %+v", s)
	}
}

// TestNUMAPreference checks that the NIC on the buffer's NUMA node
// carries its slices.
func TestNUMAPreference(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2, numa: []int{1, 0}})
	b := newNode(t, f, nodeOpts{})
	transfer(t, a, b.peer(), transport.Write, 0, 1<<20, b.addr(0)) // buffer is "cpu:0"
	if a.devs[0].Stats().PostedWRs != 0 || a.devs[1].Stats().PostedWRs != 16 {
		t.Fatalf("NUMA 1 NIC posted %d, NUMA 0 NIC posted %d", a.devs[0].Stats().PostedWRs, a.devs[1].Stats().PostedWRs)
	}
}

func TestEndpointCacheEviction(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{cfg: rdma.Config{MaxEndpoints: 2}})
	b := newNode(t, f, nodeOpts{nics: 4})
	p := b.peer()
	for round := range 3 {
		// 8 slices spread over the 4 peer NICs: 4 endpoints wanted.
		locals := make([][]byte, 8)
		remotes := make([]uint64, 8)
		for i := range locals {
			off := i * (64 << 10)
			testutil.Fill(a.buf[off:off+64<<10], uint64(round*8+i))
			locals[i] = a.buf[off : off+64<<10]
			remotes[i] = b.addr(off)
		}
		for _, r := range do(t, a, p, transport.Write, locals, remotes) {
			if r.err != nil {
				t.Fatal(r.err)
			}
		}
		mustEqual(t, "round", b.buf[:8<<16], a.buf[:8<<16])
		if s := a.tr.Stats(); s.Endpoints > 2 {
			t.Fatalf("round %d: %d endpoints cached, bound 2", round, s.Endpoints)
		}
	}
	eventually(t, "evicted endpoints destroyed", func() bool {
		s := a.tr.Stats()
		return s.Limbo == 0 && a.devs[0].Live().QPs <= 2*2
	})
	if s := a.tr.Stats(); s.Evictions == 0 {
		t.Fatalf("no eviction: %+v", s)
	}
}

// TestRetryOnAnotherPath injects one error completion: the slice is sent
// again on the other NIC pair and the request completes.
func TestRetryOnAnotherPath(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2})
	b := newNode(t, f, nodeOpts{nics: 2})
	remove := a.devs[0].Inject(soft.Fault{Kind: soft.FaultError, Count: 1, Status: rdmadev.WCRetryExcErr})
	defer remove()
	const size = 1 << 20
	testutil.Fill(a.buf[:size], 9)
	transfer(t, a, b.peer(), transport.Write, 0, size, b.addr(0))
	mustEqual(t, "write", b.buf[:size], a.buf[:size])
	s := a.tr.Stats()
	if s.WCErrors != 1 || s.SlicesRetried != 1 || s.FailedEndpoints == 0 {
		t.Fatalf("stats %+v", s)
	}
	// The endpoint that failed is rebuilt on demand.
	transfer(t, a, b.peer(), transport.Read, 2<<20, size, b.addr(0))
	mustEqual(t, "read", a.buf[2<<20:2<<20+size], b.buf[:size])
}

// TestRetriesExhausted: every path fails, the request ends in error after
// MaxRetries.
func TestRetriesExhausted(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2, cfg: rdma.Config{MaxRetries: 3, PauseErrors: 100}})
	b := newNode(t, f, nodeOpts{})
	for _, d := range a.devs {
		d.Inject(soft.Fault{Kind: soft.FaultError, Status: rdmadev.WCRetryExcErr})
	}
	rs := do(t, a, b.peer(), transport.Write, [][]byte{a.buf[:4096]}, []uint64{b.addr(0)})
	var ce *rdma.CompletionError
	if !errors.As(rs[0].err, &ce) || ce.Status != rdmadev.WCRetryExcErr || !errors.Is(rs[0].err, transport.ErrPeerGone) {
		t.Fatalf("err = %v", rs[0].err)
	}
	if s := a.tr.Stats(); s.SlicesRetried != 3 || s.WCErrors != 4 {
		t.Fatalf("stats %+v", s)
	}
}

// TestPauseAndRecovery: repeated errors on one NIC pair pause it; traffic
// moves to the other NIC; after the pause the pair carries traffic again.
func TestPauseAndRecovery(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2, cfg: rdma.Config{PauseErrors: 3, PauseWindow: time.Minute, PauseFor: 300 * time.Millisecond}})
	b := newNode(t, f, nodeOpts{})
	p := b.peer()
	remove := a.devs[0].Inject(soft.Fault{Kind: soft.FaultError, Status: rdmadev.WCRetryExcErr})
	for i := 0; a.tr.Stats().Pauses == 0; i++ {
		if i == 50 {
			t.Fatalf("pair never paused: %+v", a.tr.Stats())
		}
		transfer(t, a, p, transport.Write, 0, 256<<10, b.addr(0)) // retried on NIC 1
	}
	if s := a.tr.Stats(); s.PausedPairs != 1 {
		t.Fatalf("stats %+v", s)
	}
	posted := a.devs[0].Stats().PostedWRs
	for range 5 {
		transfer(t, a, p, transport.Write, 0, 256<<10, b.addr(0))
	}
	if got := a.devs[0].Stats().PostedWRs; got != posted {
		t.Fatalf("paused NIC got %d more work requests", got-posted)
	}
	remove()
	eventually(t, "pause to end", func() bool { return a.tr.Stats().PausedPairs == 0 })
	testutil.Fill(a.buf[:1<<20], 4)
	transfer(t, a, p, transport.Write, 0, 1<<20, b.addr(0))
	mustEqual(t, "after recovery", b.buf[:1<<20], a.buf[:1<<20])
	if got := a.devs[0].Stats().PostedWRs; got == posted {
		t.Fatal("NIC 0 not used again after its pause")
	}
}

// TestAllPathsPaused: with the only pair paused, the transport declines
// the peer (the engine then uses another transport) and fails slices
// with ErrNoPath.
func TestAllPathsPaused(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{cfg: rdma.Config{PauseErrors: 2, PauseWindow: time.Minute, PauseFor: time.Minute, MaxRetries: 5}})
	b := newNode(t, f, nodeOpts{})
	p := b.peer()
	if !a.tr.Accepts(p, b.addr(0), 4096) {
		t.Fatal("not accepted before errors")
	}
	a.devs[0].Inject(soft.Fault{Kind: soft.FaultError, Status: rdmadev.WCRNRRetryExcErr})
	rs := do(t, a, p, transport.Write, [][]byte{a.buf[:4096]}, []uint64{b.addr(0)})
	if !errors.Is(rs[0].err, rdma.ErrNoPath) {
		t.Fatalf("err = %v", rs[0].err)
	}
	if a.tr.Accepts(p, b.addr(0), 4096) {
		t.Fatal("accepted with every pair paused")
	}
}

// TestRemoteAccessErrors: an rkey that does not match, or a range beyond
// the registered region, is refused by the target NIC; the request fails
// at once (no retry) and the connection recovers for the next one.
func TestRemoteAccessErrors(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2})
	b := newNode(t, f, nodeOpts{size: 4 << 20})
	for _, tc := range []struct {
		name   string
		mangle func(d *metadata.SegmentDesc)
		remote uint64
	}{
		{"rkey mismatch", func(d *metadata.SegmentDesc) {
			for i := range d.Buffers[0].RKey {
				d.Buffers[0].RKey[i] ^= 0x100
			}
		}, b.addr(0)},
		{"beyond the region", func(d *metadata.SegmentDesc) { d.Buffers[0].Length += 1 << 20 }, b.addr(4<<20 - 4096)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := b.desc()
			tc.mangle(d)
			before := a.tr.Stats()
			rs := do(t, a, &testPeer{name: b.name, desc: d}, transport.Write, [][]byte{a.buf[:64<<10]}, []uint64{tc.remote})
			var ce *rdma.CompletionError
			if !errors.As(rs[0].err, &ce) || ce.Status != rdmadev.WCRemAccessErr || !errors.Is(rs[0].err, transport.ErrRejected) {
				t.Fatalf("err = %v", rs[0].err)
			}
			if s := a.tr.Stats(); s.SlicesRetried != before.SlicesRetried || s.Pauses != 0 {
				t.Fatalf("a request error was retried or paused the pair: %+v", s)
			}
			testutil.Fill(a.buf[:64<<10], 5)
			transfer(t, a, b.peer(), transport.Write, 0, 64<<10, b.addr(0))
			mustEqual(t, "after error", b.buf[:64<<10], a.buf[:64<<10])
		})
	}
}

// TestDeadlineStalled: a NIC that stops completing (hung) makes requests
// end with ErrTimeout — but only after their QP was reset, so the
// buffer is no longer touched when the engine gets it back.
func TestDeadlineStalled(t *testing.T) {
	for _, kind := range []soft.FaultKind{soft.FaultHang, soft.FaultDrop} {
		t.Run(kind.String(), func(t *testing.T) {
			f := soft.NewFabric()
			a := newNode(t, f, nodeOpts{cfg: rdma.Config{FlushTimeout: 150 * time.Millisecond, SweepInterval: 10 * time.Millisecond}})
			b := newNode(t, f, nodeOpts{})
			transfer(t, a, b.peer(), transport.Write, 0, 4096, b.addr(0)) // connect first
			remove := a.devs[0].Inject(soft.Fault{Kind: kind})
			defer remove()
			start := time.Now()
			deadline := start.Add(200 * time.Millisecond)
			var resetsAtCompletion uint64
			ch := make(chan result, 1)
			task := transport.NewTask(transport.Write, a.buf[:256<<10], b.addr(0), deadline, func(_ *transport.Task, n int, err error) {
				resetsAtCompletion = a.devs[0].Stats().Resets
				ch <- result{n, err, time.Now()}
			})
			a.tr.Submit(b.peer(), []*transport.Task{task})
			var r result
			select {
			case r = <-ch:
			case <-time.After(30 * time.Second):
				t.Fatal("no completion")
			}
			if !errors.Is(r.err, transport.ErrTimeout) {
				t.Fatalf("err = %v", r.err)
			}
			if r.at.Before(deadline) {
				t.Fatalf("completed %v before its deadline", deadline.Sub(r.at))
			}
			if resetsAtCompletion == 0 {
				t.Fatal("task completed before its QP was reset")
			}
			if s := a.tr.Stats(); s.QPResets == 0 {
				t.Fatalf("stats %+v", s)
			}
			remove()
			transfer(t, a, b.peer(), transport.Write, 0, 4096, b.addr(0))
		})
	}
}

// TestDelayWithinDeadline: late completions within the deadline are fine.
func TestDelayWithinDeadline(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{})
	b := newNode(t, f, nodeOpts{})
	a.devs[0].Inject(soft.Fault{Kind: soft.FaultDelay, Delay: 50 * time.Millisecond})
	testutil.Fill(a.buf[:1<<20], 6)
	transfer(t, a, b.peer(), transport.Write, 0, 1<<20, b.addr(0))
	mustEqual(t, "delayed", b.buf[:1<<20], a.buf[:1<<20])
}

// TestQPAsyncError: a QP that goes to ERR by itself flushes its work,
// which is sent again on a new endpoint.
func TestQPAsyncError(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{})
	b := newNode(t, f, nodeOpts{})
	transfer(t, a, b.peer(), transport.Write, 0, 4096, b.addr(0))
	remove := a.devs[0].Inject(soft.Fault{Kind: soft.FaultDelay, Delay: time.Hour})
	testutil.Fill(a.buf[:1<<20], 7)
	ch := submit(a, b.peer(), transport.Write, [][]byte{a.buf[:1<<20]}, []uint64{b.addr(0)}, time.Now().Add(30*time.Second))
	eventually(t, "work queued", func() bool {
		for _, q := range a.devs[0].QPs() {
			if q.Queued > 0 {
				return true
			}
		}
		return false
	})
	remove()
	for _, q := range a.devs[0].QPs() {
		if q.Queued > 0 {
			a.devs[0].ErrorQP(q.Num)
		}
	}
	r := <-ch
	if r.err != nil || r.n != 1<<20 {
		t.Fatalf("n=%d err=%v", r.n, r.err)
	}
	mustEqual(t, "after flush", b.buf[:1<<20], a.buf[:1<<20])
	if s := a.tr.Stats(); s.FailedEndpoints == 0 || a.devs[0].Stats().Flushed == 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestPortDown: a NIC whose link goes down leaves path choice after its
// first error and comes back when the port is active again.
func TestPortDown(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2, cfg: rdma.Config{PortCheckInterval: 20 * time.Millisecond, SweepInterval: 10 * time.Millisecond, PauseErrors: 100}})
	b := newNode(t, f, nodeOpts{})
	p := b.peer()
	a.devs[0].SetPortState(rdmadev.PortDown)
	testutil.Fill(a.buf[:1<<20], 8)
	transfer(t, a, p, transport.Write, 0, 1<<20, b.addr(0))
	mustEqual(t, "port down", b.buf[:1<<20], a.buf[:1<<20])
	if s := a.tr.Stats(); s.NICsDown != 1 {
		t.Fatalf("stats %+v", s)
	}
	posted := a.devs[0].Stats().PostedWRs
	transfer(t, a, p, transport.Write, 0, 1<<20, b.addr(0))
	if a.devs[0].Stats().PostedWRs != posted {
		t.Fatal("down NIC used")
	}
	a.devs[0].SetPortState(rdmadev.PortActive)
	eventually(t, "NIC back", func() bool { return a.tr.Stats().NICsDown == 0 })
	transfer(t, a, p, transport.Write, 0, 1<<20, b.addr(0))
	if a.devs[0].Stats().PostedWRs == posted {
		t.Fatal("NIC not used after its port came back")
	}
}

// TestHandshakeRefused: a peer that answers the handshake with reply_msg
// (here: asked for a NIC it does not have) fails the request with the
// peer's reason.
func TestHandshakeRefused(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{cfg: rdma.Config{MaxRetries: 2}})
	b := newNode(t, f, nodeOpts{})
	d := b.desc()
	d.Devices[0].Name = "mlx5_9"
	rs := do(t, a, &testPeer{name: b.name, desc: d}, transport.Write, [][]byte{a.buf[:4096]}, []uint64{b.addr(0)})
	if !errors.Is(rs[0].err, rdma.ErrHandshake) || !strings.Contains(rs[0].err.Error(), `device \"mlx5_9\" not found`) && !strings.Contains(rs[0].err.Error(), `device "mlx5_9" not found`) {
		t.Fatalf("err = %v; stats %+v", rs[0].err, a.tr.Stats())
	}
	if s := a.tr.Stats(); s.HandshakeErrors == 0 {
		t.Fatalf("stats %+v", s)
	}
	if s := b.tr.Stats(); s.HandshakeErrors == 0 {
		t.Fatalf("peer stats %+v", s)
	}
}

// TestHandshakeValidation sends malformed or inconsistent Connection
// requests to a node's handshake server: each is answered with an error
// (reply_msg) and creates nothing.
func TestHandshakeValidation(t *testing.T) {
	f := soft.NewFabric()
	b := newNode(t, f, nodeOpts{})
	good := func() map[string]any {
		return map[string]any{"protocol": "rdma", "local_nic_path": "10.0.0.1:15001@mlx5_0", "peer_nic_path": b.name + "@soft0",
			"qp_num": []uint32{0x123}, "local_lid": 0, "local_gid": "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:09", "reply_msg": ""}
	}
	for _, tc := range []struct {
		name, want string
		edit       func(m map[string]any)
		raw        string
	}{
		{name: "wrong server", want: "peer nic path inconsistency", edit: func(m map[string]any) { m["peer_nic_path"] = "10.9.9.9:1@soft0" }},
		{name: "unknown device", want: "not found", edit: func(m map[string]any) { m["peer_nic_path"] = b.name + "@mlx5_0" }},
		{name: "no QPs", want: "QP numbers", edit: func(m map[string]any) { m["qp_num"] = []uint32{} }},
		{name: "bad QP number", want: "QP number", edit: func(m map[string]any) { m["qp_num"] = []uint32{0} }},
		{name: "bad gid", want: "GID", edit: func(m map[string]any) { m["local_gid"] = "zz" }},
		{name: "no gid", want: "local_gid", edit: func(m map[string]any) { delete(m, "local_gid") }},
		{name: "bad local path", want: "parse peer nic path", edit: func(m map[string]any) { m["local_nic_path"] = "nodevice" }},
		{name: "qp_num not numbers", want: "malformed transfer handshake", raw: `{"protocol":"rdma","qp_num":["x"]}`},
		{name: "lid too big", want: "malformed transfer handshake", raw: `{"protocol":"rdma","local_lid":70000}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.raw)
			if tc.raw == "" {
				m := good()
				tc.edit(m)
				body = mustJSON(t, m)
			}
			before := b.devs[0].Stats().QPsCreated
			_, err := metadata.Exchange(context.Background(), b.name, metadata.Connection, body)
			if !errors.Is(err, metadata.ErrRejected) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want rejection with %q", err, tc.want)
			}
			if got := b.devs[0].Stats().QPsCreated; got != before {
				t.Fatalf("%d QPs created for a refused handshake", got-before)
			}
		})
	}
	// The well-formed request is accepted (its peer QP does not exist, so
	// nothing can flow, but the reply is complete).
	reply, err := metadata.Exchange(context.Background(), b.name, metadata.Connection, mustJSON(t, good()))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"local_nic_path":"` + b.name + `@soft0"`, `"peer_nic_path":"10.0.0.1:15001@mlx5_0"`, `"qp_num":[`, `"reply_msg":""`, `"local_gid":"00:00:`} {
		if !strings.Contains(string(reply), k) {
			t.Errorf("reply %s lacks %s", reply, k)
		}
	}
}

// TestBidirectionalSharesPassiveEndpoint: after A connected to B, B's
// transfers to A reuse the QPs A's handshake created (as the reference
// shares endpoints both ways) instead of a second handshake.
func TestBidirectionalSharesPassiveEndpoint(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{})
	b := newNode(t, f, nodeOpts{})
	testutil.Fill(a.buf[:1<<20], 10)
	transfer(t, a, b.peer(), transport.Write, 0, 1<<20, b.addr(0))
	testutil.Fill(b.buf[1<<20:2<<20], 11)
	transfer(t, b, a.peer(), transport.Write, 1<<20, 1<<20, a.addr(2<<20))
	mustEqual(t, "b->a", a.buf[2<<20:3<<20], b.buf[1<<20:2<<20])
	if s := b.tr.Stats(); s.Handshakes != 0 || s.PassiveEndpoints != 1 {
		t.Fatalf("b stats %+v", s)
	}
}

// TestConcurrentSubmitters runs several goroutines in both directions.
func TestConcurrentSubmitters(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2, size: 16 << 20})
	b := newNode(t, f, nodeOpts{nics: 2, size: 16 << 20})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from, to := a, b
			if g%2 == 1 {
				from, to = b, a
			}
			p := to.peer()
			base := g * (4 << 20)
			for it := range 10 {
				locals := make([][]byte, 16)
				remotes := make([]uint64, 16)
				for i := range locals {
					off := base + i*(128<<10)
					locals[i] = from.buf[off : off+128<<10]
					remotes[i] = to.addr(off)
				}
				op := transport.Write
				if it%2 == 1 {
					op = transport.Read
				}
				for _, r := range do(t, from, p, op, locals, remotes) {
					if r.err != nil {
						errs <- r.err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestCloseReleasesEverything: Close ends running work with ErrClosed
// (after resetting its QPs) and leaves no PD, CQ, QP or MR on any NIC.
func TestCloseReleasesEverything(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2})
	b := newNode(t, f, nodeOpts{nics: 2})
	transfer(t, a, b.peer(), transport.Write, 0, 1<<20, b.addr(0))
	transfer(t, b, a.peer(), transport.Read, 0, 1<<20, a.addr(0))
	for _, d := range a.devs {
		d.Inject(soft.Fault{Kind: soft.FaultHang})
	}
	posted := a.tr.Stats().SlicesPosted
	ch := submit(a, b.peer(), transport.Write, [][]byte{a.buf[:1<<20]}, []uint64{b.addr(0)}, time.Now().Add(time.Minute))
	eventually(t, "work posted", func() bool { return a.tr.Stats().SlicesPosted == posted+16 })
	if err := a.tr.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if !errors.Is(r.err, transport.ErrClosed) {
			t.Fatalf("err = %v", r.err)
		}
	default:
		t.Fatal("task still pending after Close")
	}
	if err := b.tr.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*node{a, b} {
		for _, d := range n.devs {
			if l := d.Live(); l != (soft.Live{}) {
				t.Errorf("%s %s: live objects after Close: %+v", n.name, d.Name(), l)
			}
		}
	}
	// Closed: everything refused, nothing pending.
	rs := do(t, a, b.peer(), transport.Write, [][]byte{a.buf[:10]}, []uint64{b.addr(0)})
	if !errors.Is(rs[0].err, transport.ErrClosed) {
		t.Fatalf("after close: %v", rs[0].err)
	}
	if a.tr.Accepts(b.peer(), b.addr(0), 10) {
		t.Fatal("accepts after close")
	}
}

// TestUnregisterWaitsForTransfers: unregistering a buffer waits for the
// slices using it, then deregisters its MRs (peers lose access).
func TestUnregisterWaitsForTransfers(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{})
	b := newNode(t, f, nodeOpts{})
	p := b.peer()
	remove := a.devs[0].Inject(soft.Fault{Kind: soft.FaultDelay, Delay: 100 * time.Millisecond})
	ch := submit(a, p, transport.Write, [][]byte{a.buf[:1<<20]}, []uint64{b.addr(0)}, time.Now().Add(30*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.tr.BeforeUnregister(ctx, a.addr(0), uint64(len(a.buf))); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
	default:
		t.Fatal("unregister returned before the transfer using the buffer completed")
	}
	remove()
	if l := a.devs[0].Live(); l.MRs != 0 {
		t.Fatalf("MRs left: %+v", l)
	}
	rs := do(t, a, p, transport.Write, [][]byte{a.buf[:10]}, []uint64{b.addr(0)})
	if !errors.Is(rs[0].err, transport.ErrNotRegistered) {
		t.Fatalf("err = %v", rs[0].err)
	}
}

// TestDescribe checks the descriptor fields, alone and after another
// transport listed its devices first.
func TestDescribe(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2, numa: []int{0, 1}})
	d := a.desc()
	if len(d.Devices) != 2 || d.Devices[0].Name != "soft0" || d.Crescent.RDMA == nil || *d.Crescent.RDMA != (metadata.RDMAInfo{FirstDevice: 0, Devices: 2}) {
		t.Fatalf("devices %+v ext %+v", d.Devices, d.Crescent.RDMA)
	}
	if _, err := rdmadev.ParseGID(d.Devices[1].GID); err != nil {
		t.Fatal(err)
	}
	b := d.Buffers[0]
	if len(b.RKey) != 2 || len(b.LKey) != 2 || b.RKey[0] == b.RKey[1] {
		t.Fatalf("keys %v %v", b.RKey, b.LKey)
	}
	pm := d.PriorityMatrix
	if fmt.Sprint(pm["cpu:0"]) != "[[soft0] [soft1]]" || fmt.Sprint(pm["cpu:1"]) != "[[soft1] [soft0]]" || len(pm["*"][0]) != 2 {
		t.Fatalf("priority matrix %v", pm)
	}
	if _, err := metadata.UnmarshalDesc(mustMarshal(t, d)); err != nil {
		t.Fatal(err)
	}
	// Another transport's device first: ours follow, keys padded.
	d2 := &metadata.SegmentDesc{Name: a.name, Protocol: "tcp", Devices: []metadata.Device{{Name: "efa0", GID: "ab"}},
		Buffers: []metadata.Buffer{{Name: "cpu:0", Addr: a.addr(0), Length: uint64(len(a.buf))}}}
	a.tr.Describe(d2)
	if len(d2.Devices) != 3 || *d2.Crescent.RDMA != (metadata.RDMAInfo{FirstDevice: 1, Devices: 2}) || len(d2.Buffers[0].RKey) != 3 || d2.Buffers[0].RKey[0] != 0 {
		t.Fatalf("shared descriptor %+v %+v", d2.Devices, d2.Buffers[0])
	}
	d2.Crescent.Protocols = []string{"rdma"}
	// A peer reading it uses the keys at index 1 and 2.
	bnode := newNode(t, f, nodeOpts{})
	testutil.Fill(bnode.buf[:4096], 12)
	rs := do(t, bnode, &testPeer{name: a.name, desc: d2}, transport.Write, [][]byte{bnode.buf[:4096]}, []uint64{a.addr(0)})
	if rs[0].err != nil {
		t.Fatal(rs[0].err)
	}
	mustEqual(t, "shared descriptor", a.buf[:4096], bnode.buf[:4096])
}

// TestPeerDescriptors: descriptors rdma cannot use are declined.
func TestPeerDescriptors(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{})
	b := newNode(t, f, nodeOpts{})
	for _, tc := range []struct {
		name string
		edit func(d *metadata.SegmentDesc)
	}{
		{"tcp only", func(d *metadata.SegmentDesc) { d.Crescent.Protocols = []string{"tcp"} }},
		{"no devices", func(d *metadata.SegmentDesc) { d.Devices = nil }},
		{"bad range", func(d *metadata.SegmentDesc) { d.Crescent.RDMA.Devices = 5 }},
		{"bad gid", func(d *metadata.SegmentDesc) { d.Devices[0].GID = "nope" }},
		{"no keys", func(d *metadata.SegmentDesc) { d.Buffers[0].RKey = nil }},
		{"key too big", func(d *metadata.SegmentDesc) { d.Buffers[0].RKey[0] = 1 << 40 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := b.desc()
			tc.edit(d)
			p := &testPeer{name: b.name, desc: d}
			if a.tr.Accepts(p, b.addr(0), 10) {
				t.Fatal("accepted")
			}
		})
	}
	// Outside the buffer.
	if a.tr.Accepts(b.peer(), b.addr(len(b.buf)), 1) {
		t.Fatal("accepted a range past the buffer")
	}
	// A reference (Mooncake) rdma descriptor: protocol rdma, no crescent
	// object, every device is an rdma NIC.
	d := b.desc()
	d.Protocol, d.Crescent = "rdma", nil
	testutil.Fill(a.buf[:8192], 13)
	rs := do(t, a, &testPeer{name: b.name, desc: d}, transport.Write, [][]byte{a.buf[:8192]}, []uint64{b.addr(0)})
	if rs[0].err != nil {
		t.Fatal(rs[0].err)
	}
	mustEqual(t, "reference descriptor", b.buf[:8192], a.buf[:8192])
}

// TestStartWithoutDevices: on this host (no RDMA NIC, or a build without
// the verbs tag) the transport reports "not supported", which the engine
// logs at Info and skips; a library that does not load reports the same.
func TestStartWithoutDevices(t *testing.T) {
	srv, err := metadata.NewServer(metadata.ServerConfig{Addr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, lib := range []string{"", "libibverbs-does-not-exist.so.7"} {
		tr := rdma.New(rdma.Config{Library: lib})
		err := tr.Start(transport.Env{LocalName: srv.Addr(), Registry: transport.NewRegistry(), Logger: quiet, Handshake: testutil.Handshake{S: srv}})
		if err == nil {
			tr.Close()
			t.Skip("this host has RDMA devices")
		}
		if !errors.Is(err, transport.ErrNotSupported) || !errors.Is(err, rdmadev.ErrNotSupported) {
			t.Fatalf("library %q: %v", lib, err)
		}
		t.Logf("library %q: %v", lib, err)
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdma.New(rdma.Config{QPsPerEndpoint: 1000}).Start(transport.Env{Handshake: testutil.Handshake{S: srv}}); !errors.Is(err, rdma.ErrConfig) {
		t.Fatalf("bad config: %v", err)
	}
}

// TestCQFailure: a NIC whose CQ fails leaves service; its posted work is
// reset after FlushTimeout and completes on the other NIC.
func TestCQFailure(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{nics: 2, cfg: rdma.Config{FlushTimeout: 100 * time.Millisecond, SweepInterval: 10 * time.Millisecond}})
	b := newNode(t, f, nodeOpts{})
	transfer(t, a, b.peer(), transport.Write, 0, 1<<20, b.addr(0))
	remove := a.devs[0].Inject(soft.Fault{Kind: soft.FaultDelay, Delay: time.Hour})
	testutil.Fill(a.buf[:1<<20], 14)
	ch := submit(a, b.peer(), transport.Write, [][]byte{a.buf[:1<<20]}, []uint64{b.addr(0)}, time.Now().Add(30*time.Second))
	eventually(t, "work queued on NIC 0", func() bool {
		for _, q := range a.devs[0].QPs() {
			if q.Queued > 0 {
				return true
			}
		}
		return false
	})
	a.devs[0].BreakCQs()
	r := <-ch
	remove()
	if r.err != nil || r.n != 1<<20 {
		t.Fatalf("n=%d err=%v", r.n, r.err)
	}
	mustEqual(t, "after CQ failure", b.buf[:1<<20], a.buf[:1<<20])
	if s := a.tr.Stats(); s.NICsDown != 1 || s.QPResets == 0 {
		t.Fatalf("stats %+v", s)
	}
	if err := a.tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPeerGone: after the target's transport closed (its QPs and keys
// gone, its handshake refusing), requests fail promptly instead of
// hanging.
func TestPeerGone(t *testing.T) {
	f := soft.NewFabric()
	a := newNode(t, f, nodeOpts{cfg: rdma.Config{MaxRetries: 2}})
	b := newNode(t, f, nodeOpts{})
	p := b.peer()
	transfer(t, a, p, transport.Write, 0, 4096, b.addr(0))
	b.close()
	rs := do(t, a, p, transport.Write, [][]byte{a.buf[:1<<20]}, []uint64{b.addr(0)})
	if rs[0].err == nil || !errors.Is(rs[0].err, rdma.ErrHandshake) {
		t.Fatalf("err = %v", rs[0].err)
	}
	t.Log(rs[0].err)
}
