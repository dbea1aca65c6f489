//go:build cgo && verbs

package verbs

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

func fdCount(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestNoDevicesHere: libibverbs loads, lists no device on this host (no
// RDMA NIC, no kernel support) and reports ErrNoDevices; loading and
// listing leave no descriptor behind.
func TestNoDevicesHere(t *testing.T) {
	before := fdCount(t)
	for range 3 {
		l, err := Load("")
		if err != nil {
			if os.Getenv("CRESCENT_REQUIRE_DEPS") == "1" {
				t.Fatalf("libibverbs: %v", err)
			}
			t.Skipf("libibverbs not installed (make deps): %v", err)
		}
		devs, err := l.Devices(Options{})
		if err == nil {
			for _, d := range devs {
				d.Close()
			}
			l.Close()
			t.Skip("this host has RDMA devices")
		}
		if !errors.Is(err, ErrNoDevices) || !errors.Is(err, rdmadev.ErrNotSupported) {
			t.Fatalf("Devices: %v", err)
		}
		t.Log(err)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal("second Close:", err)
		}
		if _, err := l.Devices(Options{}); !errors.Is(err, rdmadev.ErrClosed) {
			t.Fatalf("Devices after Close: %v", err)
		}
	}
	if after := fdCount(t); after != before {
		t.Fatalf("%d descriptors before, %d after", before, after)
	}
}

// TestLoadWrongLibrary: a library without the verbs symbols is refused.
func TestLoadWrongLibrary(t *testing.T) {
	_, err := Load("libc.so.6")
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "ibv_get_device_list") {
		t.Fatalf("err = %v", err)
	}
}

// TestPostChain drives the real PostSend shim against the fake
// provider: one crossing per batch, WRs chained in order, signaled,
// one SGE each, and a failing WR reported by index.
func TestPostChain(t *testing.T) {
	h, err := newFakeHW(8)
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	if h.qp.Num() != 0x1234 {
		t.Fatalf("qp num %#x", h.qp.Num())
	}
	wrs := []rdmadev.SendWR{
		{ID: 1, Op: rdmadev.OpWrite, Local: 0x1000, Length: 64, LKey: 7, Remote: 0x9000, RKey: 8},
		{ID: 2, Op: rdmadev.OpRead, Local: 0x2000, Length: 65536, LKey: 7, Remote: 0xa000, RKey: 9},
		{ID: 3, Op: rdmadev.OpWrite, Local: 0x3000, Length: 1, LKey: 6, Remote: 0xb000, RKey: 10},
	}
	before := Crossings()
	n, err := h.qp.PostSend(wrs)
	if n != 3 || err != nil {
		t.Fatalf("PostSend = %d, %v", n, err)
	}
	if d := Crossings().Post - before.Post; d != 1 {
		t.Fatalf("%d crossings for one batch", d)
	}
	got, flags, nsge := h.recorded()
	if len(got) != 3 {
		t.Fatalf("recorded %d", len(got))
	}
	for i := range wrs {
		if got[i] != wrs[i] || flags[i] != sendSignaled || nsge[i] != 1 {
			t.Errorf("wr %d: got %+v flags %d sge %d, want %+v", i, got[i], flags[i], nsge[i], wrs[i])
		}
	}
	// The provider refuses the second WR: one posted, queue full.
	h.failAt(1, int(unix.ENOMEM))
	n, err = h.qp.PostSend(wrs)
	if n != 1 || !errors.Is(err, rdmadev.ErrQueueFull) || !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("PostSend = %d, %v", n, err)
	}
	h.failAt(0, int(unix.EINVAL))
	if n, err = h.qp.PostSend(wrs); n != 0 || !errors.Is(err, unix.EINVAL) {
		t.Fatalf("PostSend = %d, %v", n, err)
	}
	h.failAt(-1, 0)
	// More WRs than the C arrays hold: the first 8 go, the rest is refused.
	many := make([]rdmadev.SendWR, 10)
	if n, err = h.qp.PostSend(many); n != 8 || !errors.Is(err, rdmadev.ErrQueueFull) {
		t.Fatalf("PostSend(10) = %d, %v", n, err)
	}
	if n, err = h.qp.PostSend(nil); n != 0 || err != nil {
		t.Fatalf("PostSend(nil) = %d, %v", n, err)
	}
	if posts, _, _ := h.counts(); posts != 4 {
		t.Fatalf("provider saw %d posts", posts)
	}
}

// TestPollBatch drives the Poll shim: batches of up to len(out), fields
// translated, one crossing per call.
func TestPollBatch(t *testing.T) {
	h, err := newFakeHW(64)
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	for i := range 70 {
		st, op := rdmadev.WCSuccess, 1
		if i%2 == 1 {
			op = 2
		}
		if i == 69 {
			st = rdmadev.WCRemAccessErr
		}
		h.push(uint64(i)<<32|7, st, op, uint32(i), 0x1234, uint32(i*3))
	}
	out := make([]rdmadev.Completion, 100)
	before := Crossings()
	n, err := h.cq.Poll(out)
	if n != 64 || err != nil {
		t.Fatalf("Poll = %d, %v", n, err)
	}
	n2, err := h.cq.Poll(out[64:])
	if n2 != 6 || err != nil {
		t.Fatalf("Poll = %d, %v", n2, err)
	}
	if n3, _ := h.cq.Poll(out); n3 != 0 {
		t.Fatalf("empty Poll = %d", n3)
	}
	if d := Crossings().Poll - before.Poll; d != 3 {
		t.Fatalf("%d crossings for 3 polls", d)
	}
	for i, c := range out[:70] {
		want := rdmadev.Completion{ID: uint64(i)<<32 | 7, Status: rdmadev.WCSuccess, Op: rdmadev.OpWrite, Bytes: uint32(i), QPN: 0x1234, VendorErr: uint32(i * 3)}
		if i%2 == 1 {
			want.Op = rdmadev.OpRead
		}
		if i == 69 {
			want.Status = rdmadev.WCRemAccessErr
		}
		if c != want {
			t.Fatalf("completion %d: %+v, want %+v", i, c, want)
		}
	}
}

// TestArmAndWait: Wait parks in the netpoller on the channel fd and
// returns when an event arrives, or with the context's error.
func TestArmAndWait(t *testing.T) {
	h, err := newFakeHW(8)
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	if err := h.cq.Arm(); err != nil {
		t.Fatal(err)
	}
	if _, _, arms := h.counts(); arms != 1 {
		t.Fatalf("arms %d", arms)
	}
	h.signal()
	if err := h.cq.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	// No event: the deadline ends the wait...
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err = h.cq.Wait(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v", err)
	}
	// ...and leaves no deadline behind for the next wait.
	done := make(chan error, 1)
	go func() { done <- h.cq.Wait(context.Background()) }()
	time.Sleep(20 * time.Millisecond) // let it park (the test passes either way)
	h.signal()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not wake on the event")
	}
	// Cancellation from another goroutine.
	ctx, cancel = context.WithCancel(context.Background())
	go func() { done <- h.cq.Wait(ctx) }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v", err)
	}
}
