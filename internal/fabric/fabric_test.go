package fabric_test

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/internal/fabric"
	"github.com/crescent-kv/crescent/internal/fabric/fabrictest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// needFabric skips (or, under CRESCENT_REQUIRE_DEPS=1, fails) when this
// build or host has no libfabric.
func needFabric(t testing.TB) {
	t.Helper()
	var msg string
	switch {
	case !fabric.Built:
		msg = "internal/fabric built without the fabric tag (needs cgo and libfabric-dev: run make deps, then go test -tags fabric)"
	default:
		if err := fabric.Load(""); err != nil {
			msg = err.Error() + " (run make deps)"
		}
	}
	if msg == "" {
		return
	}
	if os.Getenv("CRESCENT_REQUIRE_DEPS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// providers are the software providers the tests run on: the tcp
// provider under the RxM layer and the sockets provider (offset
// addressing), and shm (virtual addressing). CRESCENT_FI_PROVIDERS
// (comma-separated) overrides.
func providers() []string { return fabrictest.Providers("tcp;ofi_rxm", "sockets", "shm") }

// loopbackInfo picks the provider's loopback domain (or its only one).
func loopbackInfo(t testing.TB, prov string, txSize int) fabric.Info {
	t.Helper()
	infos, err := fabric.Discover(prov, txSize)
	if err != nil {
		if os.Getenv("CRESCENT_REQUIRE_DEPS") == "1" {
			t.Fatalf("discover %q: %v", prov, err)
		}
		t.Skipf("provider %q not available: %v (run make deps)", prov, err)
	}
	for _, in := range infos {
		if in.Loopback {
			return in
		}
	}
	return infos[0]
}

// mmapBuf returns page-backed memory outside the Go heap.
func mmapBuf(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

type side struct {
	ep  *fabric.Endpoint
	buf []byte
	mr  *fabric.MR
}

func openSide(t testing.TB, in fabric.Info, o fabric.Options, size int, key uint64) *side {
	t.Helper()
	ep, err := fabric.Open(in, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ep.Close(); err != nil {
			t.Error(err)
		}
	})
	s := &side{ep: ep, buf: mmapBuf(t, size)}
	if s.mr, err = ep.RegisterMR(s.buf, key); err != nil {
		t.Fatal(err)
	}
	return s
}

// remote is the address of b's byte off for an RMA to it.
func remote(in fabric.Info, b []byte, off int) uint64 {
	if in.MRMode&fabric.MRVirtAddr != 0 {
		return uint64(uintptrOf(b)) + uint64(off)
	}
	return uint64(off)
}

// run posts ops (their Slot = index) and progresses both sides until each
// completed or the deadline passed; it returns the completions by slot.
func run(t testing.TB, a, b *side, ops []fabric.Op) []error {
	t.Helper()
	errs := make([]error, len(ops))
	done := make([]bool, len(ops))
	pending := ops
	left := len(ops)
	deadline := time.Now().Add(20 * time.Second)
	for left > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d operations never completed (%d never posted)", left, len(ops), len(pending))
		}
		n := min(len(pending), a.ep.MaxBatch())
		res, comps, err := a.ep.Progress(pending[:n], false)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < res.Attempted; i++ {
			if pending[i].Err != nil {
				s := pending[i].Slot
				errs[s], done[s] = pending[i].Err, true
				left--
			}
		}
		pending = pending[res.Attempted:]
		for _, c := range comps {
			if c.Slot == fabric.NoSlot || done[c.Slot] {
				t.Fatalf("completion for slot %d unexpected", c.Slot)
			}
			errs[c.Slot], done[c.Slot] = c.Err, true
			left--
		}
		if b != nil {
			if _, _, err := b.ep.Progress(nil, false); err != nil { // the target's progress
				t.Fatal(err)
			}
		}
	}
	return errs
}

func TestLoadMissingLibrary(t *testing.T) {
	err := fabric.Load("/nonexistent/libfabric-missing.so.1")
	if !errors.Is(err, fabric.ErrNotSupported) {
		t.Fatalf("Load of a missing library: %v, want ErrNotSupported", err)
	}
	if fabric.Built && !strings.Contains(err.Error(), "libfabric-missing.so.1") {
		t.Fatalf("error does not name the library: %v", err)
	}
}

func TestDiscover(t *testing.T) {
	needFabric(t)
	if v := fabric.Version(); v == "" {
		t.Fatal("no version after Load")
	}
	for _, prov := range providers() {
		t.Run(prov, func(t *testing.T) {
			in := loopbackInfo(t, prov, 0)
			if in.Provider != prov || in.Domain == "" || in.TxSize <= 0 {
				t.Fatalf("info %+v", in)
			}
			t.Logf("%s domain %s mr_mode %v progress %d tx %d delivery %v", in.Provider, in.Domain, in.MRMode, in.Progress, in.TxSize, in.DeliveryComplete)
		})
	}
	if _, err := fabric.Discover("no-such-provider", 0); !errors.Is(err, fabric.ErrNoProvider) {
		t.Fatalf("unknown provider: %v", err)
	}
}

// TestRMA writes and reads sizes from 1 byte to 8 MiB between two
// endpoints of each provider and checks every byte.
func TestRMA(t *testing.T) {
	needFabric(t)
	for _, prov := range providers() {
		t.Run(prov, func(t *testing.T) {
			in := loopbackInfo(t, prov, 0)
			const size = 32 << 20
			a := openSide(t, in, fabric.Options{}, size, 1)
			b := openSide(t, in, fabric.Options{}, size, 2)
			peer, err := a.ep.Insert(b.ep.Name())
			if err != nil {
				t.Fatal(err)
			}
			sizes := []int{1, 7, 4096, 65536 + 3, 1 << 20, 8 << 20}
			// Writes: a's [off, off+n) to b's [off+1, ...).
			var ops []fabric.Op
			off := 0
			for i, n := range sizes {
				for j := 0; j < n; j++ {
					a.buf[off+j] = byte(i*31 + j*7)
				}
				ops = append(ops, fabric.Op{Write: true, Local: a.buf[off : off+n], MR: a.mr, Peer: peer, Remote: remote(in, b.buf, off+1), Key: b.mr.Key(), Slot: uint32(i)})
				off += n + 1
			}
			for i, err := range run(t, a, b, ops) {
				if err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
			}
			off = 0
			for i, n := range sizes {
				if !bytes.Equal(b.buf[off+1:off+1+n], a.buf[off:off+n]) {
					t.Fatalf("write %d of %d bytes: data differs", i, n)
				}
				off += n + 1
			}
			// Reads back into a's second half.
			ops = ops[:0]
			off = 0
			for i, n := range sizes {
				ops = append(ops, fabric.Op{Local: a.buf[size/2+off : size/2+off+n], MR: a.mr, Peer: peer, Remote: remote(in, b.buf, off+1), Key: b.mr.Key(), Slot: uint32(i)})
				off += n + 1
			}
			for i, err := range run(t, a, b, ops) {
				if err != nil {
					t.Fatalf("read %d: %v", i, err)
				}
			}
			off = 0
			for i, n := range sizes {
				if !bytes.Equal(a.buf[size/2+off:size/2+off+n], a.buf[off:off+n]) {
					t.Fatalf("read %d of %d bytes: data differs", i, n)
				}
				off += n + 1
			}
		})
	}
}

// TestBadKey: an operation naming a key the target never registered, and
// one on a registration the target closed, fail with the provider's text.
// (The shm provider never completes such an operation at all; the efa
// transport's tests use that for the stuck-operation path.)
func TestBadKey(t *testing.T) {
	needFabric(t)
	for _, prov := range providers() {
		t.Run(prov, func(t *testing.T) {
			if prov == "shm" {
				t.Skip("shm never completes an operation with an unknown key")
			}
			in := loopbackInfo(t, prov, 0)
			a := openSide(t, in, fabric.Options{}, 1<<20, 1)
			b := openSide(t, in, fabric.Options{}, 1<<20, 2)
			peer, err := a.ep.Insert(b.ep.Name())
			if err != nil {
				t.Fatal(err)
			}
			ok := run(t, a, b, []fabric.Op{{Write: true, Local: a.buf[:64], MR: a.mr, Peer: peer, Remote: remote(in, b.buf, 0), Key: b.mr.Key()}})
			if ok[0] != nil {
				t.Fatalf("good write: %v", ok[0])
			}
			key := b.mr.Key()
			if err := b.mr.Close(); err != nil {
				t.Fatal(err)
			}
			for _, k := range []uint64{key + 1000, key} {
				errs := run(t, a, b, []fabric.Op{{Write: true, Local: a.buf[:64], MR: a.mr, Peer: peer, Remote: remote(in, b.buf, 0), Key: k}})
				var cq *fabric.CQError
				if !errors.As(errs[0], &cq) || cq.ProvMsg == "" {
					t.Fatalf("write with key %d: %v, want a CQError with the provider's text", k, errs[0])
				}
				t.Logf("key %d: %v", k, errs[0])
				// Let the provider settle a connection it may have dropped.
				for i := 0; i < 50; i++ {
					a.ep.Progress(nil, false)
					b.ep.Progress(nil, false)
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
}

// TestEAGAIN posts more operations than a tiny transmit queue holds: the
// provider answers EAGAIN, the package makes progress and retries, and
// every operation completes.
func TestEAGAIN(t *testing.T) {
	needFabric(t)
	for _, prov := range providers() {
		t.Run(prov, func(t *testing.T) {
			fabrictest.SkipBurstLoss(t, prov) // a burst of 512 writes
			in := loopbackInfo(t, prov, 8)
			o := fabric.Options{TxSize: 8, Slots: 512}
			a := openSide(t, in, o, 4<<20, 1)
			b := openSide(t, in, o, 4<<20, 2)
			peer, err := a.ep.Insert(b.ep.Name())
			if err != nil {
				t.Fatal(err)
			}
			before := fabric.ReadStats()
			ops := make([]fabric.Op, 512)
			for i := range ops {
				ops[i] = fabric.Op{Write: true, Local: a.buf[i*4096 : (i+1)*4096], MR: a.mr, Peer: peer, Remote: remote(in, b.buf, i*4096), Key: b.mr.Key(), Slot: uint32(i)}
				a.buf[i*4096] = byte(i)
			}
			for i, err := range run(t, a, b, ops) {
				if err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
			}
			for i := range ops {
				if b.buf[i*4096] != byte(i) {
					t.Fatalf("op %d: data missing", i)
				}
			}
			d := fabric.ReadStats().Sub(before)
			if d.EAGAIN == 0 {
				t.Fatalf("no EAGAIN with a transmit queue of %d: %+v", in.TxSize, d)
			}
			t.Logf("tx %d: %d EAGAIN, %d progress calls for 512 ops", in.TxSize, d.EAGAIN, d.ProgressCalls)
		})
	}
}

// TestOneCrossingPerBatch: posting 128 operations is one crossing.
func TestOneCrossingPerBatch(t *testing.T) {
	needFabric(t)
	in := loopbackInfo(t, providers()[0], 0)
	a := openSide(t, in, fabric.Options{}, 1<<20, 1)
	b := openSide(t, in, fabric.Options{}, 1<<20, 2)
	peer, err := a.ep.Insert(b.ep.Name())
	if err != nil {
		t.Fatal(err)
	}
	run(t, a, b, []fabric.Op{{Write: true, Local: a.buf[:8], MR: a.mr, Peer: peer, Remote: remote(in, b.buf, 0), Key: b.mr.Key()}}) // connect
	ops := make([]fabric.Op, 128)
	for i := range ops {
		ops[i] = fabric.Op{Write: true, Local: a.buf[i*64 : (i+1)*64], MR: a.mr, Peer: peer, Remote: remote(in, b.buf, i*64), Key: b.mr.Key(), Slot: uint32(i)}
	}
	before := fabric.ReadStats()
	res, _, err := a.ep.Progress(ops, false)
	if err != nil {
		t.Fatal(err)
	}
	d := fabric.ReadStats().Sub(before)
	if res.Posted != 128 || d.Calls != 1 {
		t.Fatalf("posted %d in %d crossings, want 128 in 1", res.Posted, d.Calls)
	}
	left := 128
	for _, c := range func() []fabric.Completion { _, c, _ := a.ep.Progress(nil, false); return c }() {
		if c.Err != nil {
			t.Fatal(c.Err)
		}
		left--
	}
	for deadline := time.Now().Add(20 * time.Second); left > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d completions missing", left)
		}
		b.ep.Progress(nil, false)
		_, comps, _ := a.ep.Progress(nil, false)
		left -= len(comps)
	}
}

func TestClosed(t *testing.T) {
	needFabric(t)
	in := loopbackInfo(t, providers()[0], 0)
	ep, err := fabric.Open(in, fabric.Options{})
	if err != nil {
		t.Fatal(err)
	}
	buf := mmapBuf(t, 4096)
	mr, err := ep.RegisterMR(buf, 9)
	if err != nil {
		t.Fatal(err)
	}
	if err := ep.Close(); err != nil {
		t.Fatal(err)
	}
	if err := mr.Close(); err != nil {
		t.Fatalf("MR close after endpoint close: %v", err)
	}
	if _, _, err := ep.Progress(nil, false); !errors.Is(err, fabric.ErrClosed) {
		t.Fatalf("Progress after Close: %v", err)
	}
	if _, err := ep.RegisterMR(buf, 1); !errors.Is(err, fabric.ErrClosed) {
		t.Fatalf("RegisterMR after Close: %v", err)
	}
	if err := ep.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestErrno(t *testing.T) {
	if got := fabric.ECANCELED.Error(); got != "operation canceled" {
		t.Fatalf("ECANCELED = %q", got)
	}
	if got := fabric.ENOKEY.Error(); got != "Required key not available" {
		t.Fatalf("ENOKEY = %q", got)
	}
	if !errors.Is(fabric.ENOTCONN, unix.ENOTCONN) {
		t.Fatal("Errno does not match unix.Errno")
	}
	e := &fabric.CQError{Errno: fabric.ECANCELED, ProvErrno: 2, ProvMsg: "No such file or directory"}
	if !errors.Is(e, fabric.ECANCELED) || !strings.Contains(e.Error(), "No such file or directory") {
		t.Fatalf("CQError %v", e)
	}
}

// BenchmarkPost128 posts 128 64-byte writes in one Progress call and
// drains their completions: crossings per batch are reported.
func BenchmarkPost128(b *testing.B) {
	needFabric(b)
	in := loopbackInfo(b, providers()[0], 0)
	x := openSide(b, in, fabric.Options{}, 1<<20, 1)
	y := openSide(b, in, fabric.Options{}, 1<<20, 2)
	peer, err := x.ep.Insert(y.ep.Name())
	if err != nil {
		b.Fatal(err)
	}
	ops := make([]fabric.Op, 128)
	for i := range ops {
		ops[i] = fabric.Op{Write: true, Local: x.buf[i*64 : (i+1)*64], MR: x.mr, Peer: peer, Remote: remote(in, y.buf, i*64), Key: y.mr.Key(), Slot: uint32(i)}
	}
	run(b, x, y, ops[:1]) // connect
	b.SetBytes(128 * 64)
	b.ReportAllocs()
	before := fabric.ReadStats()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		run(b, x, y, ops)
	}
	b.StopTimer()
	d := fabric.ReadStats().Sub(before)
	b.ReportMetric(float64(d.Calls)/float64(b.N), "crossings/batch")
	b.ReportMetric(float64(d.PostCalls)/float64(b.N), "posts/batch")
}
