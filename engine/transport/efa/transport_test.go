package efa_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/efa"
	"github.com/crescent-kv/crescent/internal/fabric"
	"github.com/crescent-kv/crescent/internal/fabric/fabrictest"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// TestRoundTrip writes sizes from 1 byte to 8 MiB (sliced above 2 MiB)
// from a to b, reads them back, and has b write to a, checking every
// byte, on each provider and in both wait modes. The shm provider adds
// virtual addressing (FI_MR_VIRT_ADDR) to the others' offsets.
func TestRoundTrip(t *testing.T) {
	needFabric(t)
	for _, prov := range append(providers(), "shm") {
		for _, wait := range []string{efa.WaitAuto, efa.WaitPoll} {
			t.Run(prov+"/"+wait, func(t *testing.T) {
				needProvider(t, prov)
				cfg := efa.Config{Wait: wait, SliceSize: 2 << 20}
				a := newNode(t, prov, 32<<20, cfg)
				b := newNode(t, prov, 32<<20, cfg)
				sizes := []int{1, 3, 4096, 65536 + 5, 1 << 20, 8 << 20}
				results := make(chan result, 64)
				dl := time.Now().Add(30 * time.Second)
				pb := b.peer()
				var tasks []*transport.Task
				off := 0
				for i, n := range sizes {
					testutil.Fill(a.buf[off:off+n], uint64(i))
					tasks = append(tasks, task(results, transport.Write, a.buf[off:off+n], b.addr(off+1), dl))
					off += n + 1
				}
				for _, r := range submit(t, a, pb, tasks, results, 30*time.Second) {
					if r.err != nil {
						t.Fatalf("write: %v", r.err)
					}
				}
				off = 0
				for i, n := range sizes {
					if !bytes.Equal(b.buf[off+1:off+1+n], a.buf[off:off+n]) {
						t.Fatalf("write %d (%d bytes): data differs", i, n)
					}
					off += n + 1
				}
				// Read back into a's upper half.
				tasks = tasks[:0]
				off = 0
				half := 16 << 20
				for _, n := range sizes {
					tasks = append(tasks, task(results, transport.Read, a.buf[half+off:half+off+n], b.addr(off+1), dl))
					off += n + 1
				}
				for _, r := range submit(t, a, pb, tasks, results, 30*time.Second) {
					if r.err != nil {
						t.Fatalf("read: %v", r.err)
					}
				}
				off = 0
				for i, n := range sizes {
					if !bytes.Equal(a.buf[half+off:half+off+n], a.buf[off:off+n]) {
						t.Fatalf("read %d (%d bytes): data differs", i, n)
					}
					off += n + 1
				}
				// The other way: b writes to a.
				testutil.Fill(b.buf[:1<<20], 99)
				r := submit(t, b, a.peer(), []*transport.Task{task(results, transport.Write, b.buf[:1<<20], a.addr(24<<20), dl)}, results, 30*time.Second)
				if r[0].err != nil || !bytes.Equal(a.buf[24<<20:25<<20], b.buf[:1<<20]) {
					t.Fatalf("b -> a: %v", r[0].err)
				}
				st := a.tr.Stats()
				if st.Handshakes != uint64(len(st.Domains)) || st.Completed != 12 || st.Failed != 0 || st.Ops < 12+3 {
					t.Fatalf("stats %+v", st)
				}
				if ps := b.tr.Stats(); ps.PassiveHandshakes != uint64(len(st.Domains)) {
					t.Fatalf("peer answered %d handshakes, want %d", ps.PassiveHandshakes, len(st.Domains))
				}
			})
		}
	}
}

// TestDescribe: the descriptor carries the domains after devices already
// listed, every buffer's keys aligned with them, and the extension; a
// reference peer's decoder rules hold.
func TestDescribe(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	n := newNode(t, prov, 1<<20, efa.Config{})
	d := &metadata.SegmentDesc{Name: n.name, Protocol: "tcp", Crescent: &metadata.Extension{Version: 1},
		Devices: []metadata.Device{{Name: "mlx5_0", GID: "fe80::1"}},
		Buffers: []metadata.Buffer{{Name: "cpu:0", Addr: n.addr(0), Length: uint64(len(n.buf)), RKey: []uint64{7}, LKey: []uint64{7}}, {Name: "cpu:0", Addr: 1 << 40, Length: 4096}}}
	n.tr.Describe(d)
	doms := n.tr.Domains()
	ext := d.Crescent.EFA
	if ext == nil || ext.Provider != prov || ext.FirstDevice != 1 || ext.Devices != len(doms) || ext.VirtAddr {
		t.Fatalf("extension %+v", ext)
	}
	if len(d.Devices) != 1+len(doms) || d.Devices[1].Name != doms[0] || d.Devices[1].GID == "" {
		t.Fatalf("devices %+v", d.Devices)
	}
	b := d.Buffers[0]
	if len(b.RKey) != 1+len(doms) || b.RKey[0] != 7 || len(b.LKey) != len(b.RKey) {
		t.Fatalf("keys %v %v", b.RKey, b.LKey)
	}
	if len(d.Buffers[1].RKey) != 0 {
		t.Fatalf("a buffer efa did not register got keys %v", d.Buffers[1].RKey)
	}
	raw, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := metadata.UnmarshalDesc(raw); err != nil {
		t.Fatalf("descriptor does not decode: %v\n%s", err, raw)
	}
	if !strings.Contains(string(raw), `"efa":{"provider":"`+prov+`"`) {
		t.Fatalf("no efa extension in %s", raw)
	}
}

// TestBatchOneCrossing: a batch of 128 requests is posted in one crossing
// into C, and completions are read many per crossing.
func TestBatchOneCrossing(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	a := newNode(t, prov, 16<<20, efa.Config{})
	b := newNode(t, prov, 16<<20, efa.Config{})
	pb := b.peer()
	results := make(chan result, 256)
	dl := time.Now().Add(30 * time.Second)
	if err := a.tr.Warmup(context.Background(), pb); err != nil {
		t.Fatal(err)
	}
	submit(t, a, pb, []*transport.Task{task(results, transport.Write, a.buf[:8], b.addr(0), dl)}, results, 30*time.Second) // connect
	for round := 0; round < 3; round++ {
		tasks := make([]*transport.Task, 128)
		for i := range tasks {
			tasks[i] = task(results, transport.Write, a.buf[i<<16:(i+1)<<16], b.addr(i<<16), dl)
		}
		before := fabric.ReadStats()
		for _, r := range submit(t, a, pb, tasks, results, 30*time.Second) {
			if r.err != nil {
				t.Fatal(r.err)
			}
		}
		d := fabric.ReadStats().Sub(before)
		t.Logf("128 x 64 KiB: %d crossings (%d progress calls, %d posting, %d completions)", d.Calls, d.ProgressCalls, d.PostCalls, d.Completions)
		if d.Posted != 128 || d.PostCalls != 1 {
			t.Fatalf("128 requests posted in %d calls (%d ops), want 1", d.PostCalls, d.Posted)
		}
	}
}

// TestOutOfBounds: Accepts refuses ranges outside the peer's registered
// buffers, and Submit rejects them without touching the provider.
func TestOutOfBounds(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	a := newNode(t, prov, 1<<20, efa.Config{})
	b := newNode(t, prov, 1<<20, efa.Config{})
	pb := b.peer()
	if !a.tr.Accepts(pb, b.addr(0), 1<<20) || a.tr.Accepts(pb, b.addr(1), 1<<20) || a.tr.Accepts(pb, b.addr(0)-1, 1) {
		t.Fatal("Accepts disagrees with the registered range")
	}
	results := make(chan result, 4)
	r := submit(t, a, pb, []*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(1<<20-32), time.Now().Add(5*time.Second))}, results, 10*time.Second)
	if !errors.Is(r[0].err, transport.ErrOutOfBounds) {
		t.Fatalf("out-of-bounds write: %v", r[0].err)
	}
	// Local memory that is not registered.
	r = submit(t, a, pb, []*transport.Task{task(results, transport.Write, make([]byte, 64), b.addr(0), time.Now().Add(5*time.Second))}, results, 10*time.Second)
	if !errors.Is(r[0].err, transport.ErrNotRegistered) {
		t.Fatalf("unregistered local memory: %v", r[0].err)
	}
}

// TestUnknownKeyAndRevoked: a request naming a key the target never
// issued, and one on a buffer the target deregistered, fail with the
// provider's error text; later requests succeed.
func TestUnknownKeyAndRevoked(t *testing.T) {
	needFabric(t)
	for _, prov := range providers() {
		t.Run(prov, func(t *testing.T) {
			needProvider(t, prov)
			a := newNode(t, prov, 1<<20, efa.Config{})
			b := newNode(t, prov, 4<<20, efa.Config{})
			good := b.desc()
			bad := b.desc()
			for i := range bad.Buffers {
				for k := range bad.Buffers[i].RKey {
					bad.Buffers[i].RKey[k] += 1000
				}
			}
			results := make(chan result, 8)
			dl := func() time.Time { return time.Now().Add(10 * time.Second) }
			r := submit(t, a, &testPeer{name: b.name, desc: func() *metadata.SegmentDesc { return bad }}, []*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(0), dl())}, results, 20*time.Second)
			var cq *fabric.CQError
			if !errors.As(r[0].err, &cq) || cq.ProvMsg == "" || !strings.Contains(r[0].err.Error(), "provider: ") {
				t.Fatalf("unknown key: %v, want the provider's error", r[0].err)
			}
			t.Logf("unknown key: %v", r[0].err)
			pg := &testPeer{name: b.name, desc: func() *metadata.SegmentDesc { return good }}
			ok := submit(t, a, pg, []*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(0), dl())}, results, 20*time.Second)
			if ok[0].err != nil {
				t.Fatalf("good write after a failed one: %v", ok[0].err)
			}
			// b withdraws its buffer; a still has the old descriptor.
			if err := b.tr.BeforeUnregister(context.Background(), b.addr(0), uint64(len(b.buf))); err != nil {
				t.Fatal(err)
			}
			r = submit(t, a, pg, []*transport.Task{task(results, transport.Read, a.buf[:64], b.addr(0), dl())}, results, 20*time.Second)
			if !errors.As(r[0].err, &cq) || cq.ProvMsg == "" {
				t.Fatalf("read of a revoked buffer: %v, want the provider's error", r[0].err)
			}
			t.Logf("revoked: %v", r[0].err)
		})
	}
}

// TestBackPressure: with a transmit queue of 8 and 256 operations allowed
// in flight, the provider answers EAGAIN; every request still completes.
func TestBackPressure(t *testing.T) {
	needFabric(t)
	for _, prov := range providers() {
		t.Run(prov, func(t *testing.T) {
			needProvider(t, prov)
			// 1024 writes; on sockets the lost ones end in ErrPeerGone.
			fabrictest.SkipBurstLoss(t, prov)
			cfg := efa.Config{TxSize: 8, MaxInflight: 256}
			a := newNode(t, prov, 4<<20, cfg)
			b := newNode(t, prov, 4<<20, cfg)
			results := make(chan result, 1024)
			dl := time.Now().Add(60 * time.Second)
			tasks := make([]*transport.Task, 1024)
			for i := range tasks {
				a.buf[i*4096] = byte(i)
				tasks[i] = task(results, transport.Write, a.buf[i*4096:(i+1)*4096], b.addr(i*4096), dl)
			}
			a.tr.Submit(b.peer(), tasks)
			timer := time.NewTimer(30 * time.Second)
			defer timer.Stop()
			for got := 0; got < len(tasks); got++ {
				select {
				case r := <-results:
					if r.err != nil {
						t.Fatal(r.err)
					}
				case <-timer.C:
					t.Fatalf("%d of %d requests not completed after 30s; initiator %+v; target %+v; fabric %+v", len(tasks)-got, len(tasks), a.tr.Stats(), b.tr.Stats(), fabric.ReadStats())
				}
			}
			for i := range tasks {
				if b.buf[i*4096] != byte(i) {
					t.Fatalf("request %d: data missing", i)
				}
			}
			st := a.tr.Stats()
			if st.EAGAIN == 0 {
				t.Fatalf("no EAGAIN with a transmit queue of 8: %+v", st)
			}
			t.Logf("1024 requests: %d EAGAIN, %d ops", st.EAGAIN, st.Ops)
		})
	}
}

// TestStuckOperation: the shm provider never completes an operation with
// an unknown key. The request's deadline passes, the provider is asked to
// cancel, and StuckGrace later the endpoint is replaced: only then does
// the task end (ErrTimeout), its buffer no longer in the provider's
// hands. The transport keeps working.
func TestStuckOperation(t *testing.T) {
	needFabric(t)
	const prov = "shm"
	needProvider(t, prov)
	cfg := efa.Config{StuckGrace: 300 * time.Millisecond}
	a := newNode(t, prov, 1<<20, cfg)
	b := newNode(t, prov, 1<<20, cfg)
	bad := b.desc()
	for i := range bad.Buffers {
		for k := range bad.Buffers[i].RKey {
			bad.Buffers[i].RKey[k] += 1000
		}
	}
	results := make(chan result, 4)
	start := time.Now()
	deadline := start.Add(300 * time.Millisecond)
	r := submit(t, a, &testPeer{name: b.name, desc: func() *metadata.SegmentDesc { return bad }},
		[]*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(0), deadline)}, results, 20*time.Second)
	if !errors.Is(r[0].err, transport.ErrTimeout) {
		t.Fatalf("stuck write: %v, want ErrTimeout", r[0].err)
	}
	if el := time.Since(start); el < 600*time.Millisecond {
		t.Fatalf("task ended after %v, before deadline + StuckGrace", el)
	}
	st := a.tr.Stats()
	if st.Resets != 1 || st.Cancels != 1 {
		t.Fatalf("stats %+v, want 1 cancel and 1 reset", st)
	}
	testutil.Fill(a.buf[:4096], 5)
	r = submit(t, a, b.peer(), []*transport.Task{task(results, transport.Write, a.buf[:4096], b.addr(0), time.Now().Add(10*time.Second))}, results, 20*time.Second)
	if r[0].err != nil || !bytes.Equal(b.buf[:4096], a.buf[:4096]) {
		t.Fatalf("write after reset: %v", r[0].err)
	}
}

// TestPeerClosedMidBatch: the target closes while 128 1-MiB writes run;
// every request ends (failed, or timed out at its deadline) and none
// hangs.
func TestPeerClosedMidBatch(t *testing.T) {
	needFabric(t)
	for _, prov := range providers() {
		t.Run(prov, func(t *testing.T) {
			needProvider(t, prov)
			cfg := efa.Config{StuckGrace: time.Second}
			a := newNode(t, prov, 128<<20, cfg)
			b := startNode(t, prov, 128<<20, cfg)
			defer b.close()
			pb := b.peer()
			results := make(chan result, 256)
			deadline := time.Now().Add(5 * time.Second)
			tasks := make([]*transport.Task, 128)
			for i := range tasks {
				tasks[i] = task(results, transport.Write, a.buf[i<<20:(i+1)<<20], b.addr(i<<20), deadline)
			}
			a.tr.Submit(pb, tasks)
			time.Sleep(20 * time.Millisecond)
			b.close()
			var ok, failed, timedOut int
			for _, r := range collect(t, results, len(tasks), 30*time.Second) {
				switch {
				case r.err == nil:
					ok++
				case errors.Is(r.err, transport.ErrTimeout):
					timedOut++
				default:
					failed++
				}
			}
			t.Logf("%d completed, %d failed, %d timed out", ok, failed, timedOut)
			if ok == len(tasks) {
				t.Log("every write finished before the peer closed")
			}
		})
	}
}

// TestWarmup: Warmup does the handshake with every domain and inserts
// the peer's addresses; the first request needs neither, and a second
// Warmup does nothing.
func TestWarmup(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	a := newNode(t, prov, 1<<20, efa.Config{})
	b := newNode(t, prov, 1<<20, efa.Config{})
	pb := b.peer()
	before := fabric.ReadStats()
	if err := a.tr.Warmup(context.Background(), pb); err != nil {
		t.Fatal(err)
	}
	doms := len(a.tr.Domains())
	if d := fabric.ReadStats().Sub(before); d.AVInserts != uint64(doms) || a.tr.Stats().Handshakes != uint64(doms) {
		t.Fatalf("warm-up: %d inserts, %d handshakes; want %d", d.AVInserts, a.tr.Stats().Handshakes, doms)
	}
	if err := a.tr.Warmup(context.Background(), pb); err != nil {
		t.Fatal(err)
	}
	results := make(chan result, 1)
	r := submit(t, a, pb, []*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(0), time.Now().Add(10*time.Second))}, results, 20*time.Second)
	if r[0].err != nil {
		t.Fatal(r[0].err)
	}
	if d := fabric.ReadStats().Sub(before); d.AVInserts != uint64(doms) || a.tr.Stats().Handshakes != uint64(doms) {
		t.Fatalf("after warm-up and a request: %d inserts, %d handshakes; want %d", d.AVInserts, a.tr.Stats().Handshakes, doms)
	}
	// A peer that is gone: Warmup fails, and so do requests to it.
	b.close()
	gone := &testPeer{name: b.name, desc: pb.desc}
	a.tr.ClosePeer(b.name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.tr.Warmup(ctx, gone); err == nil {
		t.Fatal("warm-up of a closed peer succeeded")
	}
	r = submit(t, a, gone, []*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(0), time.Now().Add(10*time.Second))}, results, 20*time.Second)
	if !errors.Is(r[0].err, transport.ErrUnreachable) {
		t.Fatalf("request to a closed peer: %v", r[0].err)
	}
}

// TestHandshakeRejects: the Connection handler refuses messages that do
// not name one of its domains or carry no address, with the reference's
// reply texts.
func TestHandshakeRejects(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	b := newNode(t, prov, 1<<20, efa.Config{})
	dom := b.tr.Domains()[0]
	for _, tc := range []struct {
		name, body, want string
	}{
		{"malformed", `{"protocol":"efa","qp_num":"x"}`, "Malformed transfer handshake"},
		{"other server", `{"protocol":"efa","peer_nic_path":"10.0.0.1:1@` + dom + `","efa_addr":"00"}`, "EFA nic path inconsistency"},
		{"no address", `{"protocol":"efa","peer_nic_path":"` + b.name + `@` + dom + `"}`, "No EFA address provided"},
		{"bad hex", `{"protocol":"efa","peer_nic_path":"` + b.name + `@` + dom + `","efa_addr":"zz"}`, "No EFA address provided"},
		{"unknown device", `{"protocol":"efa","peer_nic_path":"` + b.name + `@nope0","efa_addr":"00"}`, "unknown EFA device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := metadata.Exchange(context.Background(), b.name, metadata.Connection, []byte(tc.body))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("reply error %v, want %q", err, tc.want)
			}
		})
	}
	rep, err := metadata.Exchange(context.Background(), b.name, metadata.Connection, []byte(`{"protocol":"efa","local_nic_path":"x:1@lo","peer_nic_path":"`+b.name+`@`+dom+`","efa_addr":"0a0b"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"protocol":"efa"`, `"local_nic_path":"` + b.name + `@` + dom + `"`, `"peer_nic_path":"x:1@lo"`, `"efa_addr":"`, `"reply_msg":""`, `"qp_num":[]`} {
		if !strings.Contains(string(rep), f) {
			t.Fatalf("reply %s lacks %s", rep, f)
		}
	}
}

// TestIdleCost: an idle transport's workers sleep (on the wait fd, or
// with backoff), rather than spin.
func TestIdleCost(t *testing.T) {
	needFabric(t)
	for _, prov := range providers() {
		t.Run(prov, func(t *testing.T) {
			needProvider(t, prov)
			a := newNode(t, prov, 1<<20, efa.Config{})
			b := newNode(t, prov, 1<<20, efa.Config{})
			results := make(chan result, 1)
			submit(t, a, b.peer(), []*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(0), time.Now().Add(10*time.Second))}, results, 20*time.Second)
			time.Sleep(100 * time.Millisecond)
			before := a.tr.Stats().Loops + b.tr.Stats().Loops
			time.Sleep(500 * time.Millisecond)
			loops := a.tr.Stats().Loops + b.tr.Stats().Loops - before
			t.Logf("%d polling rounds in 500 ms idle", loops)
			if loops > 3000 {
				t.Fatalf("%d polling rounds in 500 ms idle: the workers spin", loops)
			}
		})
	}
}

// TestCloseReleases: starting and closing transports (with traffic)
// leaves no fd and no goroutine behind (goleak in TestMain), and pending
// requests end with ErrClosed.
func TestCloseReleases(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	cycle := func() {
		a := startNode(t, prov, 1<<20, efa.Config{})
		b := startNode(t, prov, 1<<20, efa.Config{})
		results := make(chan result, 1)
		submit(t, a, b.peer(), []*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(0), time.Now().Add(10*time.Second))}, results, 20*time.Second)
		a.close()
		b.close()
	}
	cycle() // libfabric's one-time initialisation
	before := openFDs(t)
	for i := 0; i < 3; i++ {
		cycle()
	}
	deadline := time.Now().Add(5 * time.Second)
	for openFDs(t) > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d fds before, %d after", before, openFDs(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Requests submitted after Close fail at once.
	a := startNode(t, prov, 1<<20, efa.Config{})
	b := newNode(t, prov, 1<<20, efa.Config{})
	a.close()
	results := make(chan result, 1)
	r := submit(t, a, b.peer(), []*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(0), time.Now().Add(10*time.Second))}, results, 5*time.Second)
	if !errors.Is(r[0].err, transport.ErrClosed) {
		t.Fatalf("after Close: %v", r[0].err)
	}
}
