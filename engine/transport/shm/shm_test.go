package shm_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/shm"
	"github.com/crescent-kv/crescent/internal/testutil"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// nodeOpts configures newNode; the zero value is a same-host node.
type nodeOpts struct {
	hostID      string
	cfg         shm.Config
	beforeStart func(*shm.Transport)
	log         *slog.Logger // default: discard
}

// node is one shm transport with the memory it registered.
type node struct {
	name   string
	hostID string
	tr     *shm.Transport
	reg    *transport.Registry
	pools  []*mempool.Pool
	buf    []byte // the first registered buffer
	once   sync.Once
}

var poolSeq atomic.Int64

// poolName is unique per pool, so /proc/self/maps tells its mappings apart.
func poolName() string {
	return fmt.Sprintf("crescent-shm-test-%d-%d", os.Getpid(), poolSeq.Add(1))
}

func newNode(tb testing.TB, name string, size int, o nodeOpts) *node {
	tb.Helper()
	n := startNode(tb, name, size, o)
	tb.Cleanup(n.close)
	return n
}

// startNode is newNode without the cleanup, for tests that count fds.
func startNode(tb testing.TB, name string, size int, o nodeOpts) *node {
	tb.Helper()
	if o.hostID == "" {
		o.hostID = "same"
	}
	n := &node{name: name, hostID: o.hostID, reg: transport.NewRegistry(), tr: shm.New(o.cfg)}
	if o.beforeStart != nil {
		o.beforeStart(n.tr)
	}
	if o.log == nil {
		o.log = quiet
	}
	if err := n.tr.Start(transport.Env{LocalName: name, Host: "127.0.0.1", HostID: o.hostID, Registry: n.reg, Logger: o.log}); err != nil {
		tb.Fatal(err)
	}
	if size > 0 {
		n.buf = n.addPool(tb, size, 1<<20)
	}
	return n
}

// addPool registers all of a new memfd pool and returns its memory.
func (n *node) addPool(tb testing.TB, size int, slab int64) []byte {
	tb.Helper()
	p, err := mempool.New(mempool.Options{Size: int64(size), SlabSize: slab, Name: poolName()})
	if err != nil {
		tb.Fatal(err)
	}
	n.pools = append(n.pools, p)
	b, err := p.Alloc(size)
	if err != nil {
		tb.Fatal(err)
	}
	n.register(tb, b)
	return b
}

// register adds b to the registry, with its memfd when it has one, as
// engine.RegisterMemory does.
func (n *node) register(tb testing.TB, b []byte) {
	tb.Helper()
	fd, off, size := -1, int64(0), int64(0)
	if pfd, poff, p, ok := mempool.Lookup(b); ok {
		fd, off, size = pfd, poff, p.Size()
	}
	if _, err := n.reg.Add(b, "cpu:0", fd, off, size); err != nil {
		tb.Fatal(err)
	}
}

// unregister is engine.UnregisterMemory: revoke, then remove.
func (n *node) unregister(tb testing.TB, b []byte) error {
	tb.Helper()
	addr := transport.AddrOf(b)
	err := n.tr.BeforeUnregister(context.Background(), addr, uint64(len(b)))
	if _, rerr := n.reg.Remove(context.Background(), addr); rerr != nil {
		tb.Fatal(rerr)
	}
	return err
}

func (n *node) close() {
	n.once.Do(func() {
		n.tr.Close()
		n.reg.Close()
		for _, p := range n.pools {
			p.Close()
		}
	})
}

func (n *node) addr(off int) uint64 { return transport.AddrOf(n.buf) + uint64(off) }

// desc is what engine.LocalDesc publishes for this node.
func (n *node) desc() *metadata.SegmentDesc {
	d := &metadata.SegmentDesc{Name: n.name, Protocol: "tcp", Crescent: &metadata.Extension{Version: 1, HostID: n.hostID}}
	for _, r := range n.reg.Regions() {
		d.Buffers = append(d.Buffers, metadata.Buffer{Name: r.Location, Addr: r.Addr, Length: r.Len()})
	}
	n.tr.Describe(d)
	return d
}

func (n *node) peer() transport.Peer { return &testPeer{name: n.name, desc: n.desc} }

// mapped counts this process's mappings of n's pools' memfds: the pools'
// own arenas plus what peers mapped.
func (n *node) mapped(tb testing.TB) int {
	tb.Helper()
	data, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		tb.Fatal(err)
	}
	count := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		for _, p := range n.pools {
			if strings.HasSuffix(sc.Text(), "/memfd:"+p.Name()+" (deleted)") {
				count++
			}
		}
	}
	return count
}

type testPeer struct {
	name string
	desc func() *metadata.SegmentDesc
}

func (p *testPeer) Name() string                { return p.name }
func (p *testPeer) Desc() *metadata.SegmentDesc { return p.desc() }
func (p *testPeer) Refresh(context.Context) (*metadata.SegmentDesc, error) {
	return p.desc(), nil
}

type result struct {
	task *transport.Task
	n    int
	err  error
}

// do submits one task and returns its outcome; shm copies inline, so the
// completion must have come when Submit returns.
func do(tb testing.TB, tr transport.Transport, p transport.Peer, op transport.Op, local []byte, remote uint64) result {
	tb.Helper()
	var got []result
	tk := transport.NewTask(op, local, remote, time.Now().Add(30*time.Second), func(t *transport.Task, n int, err error) {
		got = append(got, result{t, n, err})
	})
	tr.Submit(p, []*transport.Task{tk})
	if len(got) != 1 {
		tb.Fatalf("%d completions when Submit returned, want 1", len(got))
	}
	return got[0]
}

var ops = []transport.Op{transport.Write, transport.Read}

func TestRoundTrip(t *testing.T) {
	a := newNode(t, "a", 8<<20, nodeOpts{})
	b := newNode(t, "b", 8<<20, nodeOpts{})
	pb := b.peer()
	for i, size := range []int{1, 7, 4095, 4096, 64<<10 + 1, 1<<20 + 13, 5<<20 + 3} {
		for _, op := range ops {
			t.Run(fmt.Sprintf("%s/%d", op, size), func(t *testing.T) {
				local := a.buf[3 : 3+size]
				roff := 4093 + i // straddles a page boundary
				remote := b.buf[roff : roff+size]
				src, dst := local, remote
				if op == transport.Read {
					src, dst = remote, local
				}
				testutil.Fill(src, uint64(2*i)+uint64(op))
				clear(dst)
				if !a.tr.Accepts(pb, b.addr(roff), uint64(size)) {
					t.Fatal("Accepts = false for a same-host shareable buffer")
				}
				r := do(t, a.tr, pb, op, local, b.addr(roff))
				if r.err != nil || r.n != size {
					t.Fatalf("n=%d err=%v", r.n, r.err)
				}
				if !bytes.Equal(dst, src) {
					t.Fatalf("data differs: %s", testutil.FirstDiff(dst, src))
				}
			})
		}
	}
}

func TestAccepts(t *testing.T) {
	a := newNode(t, "a", 1<<20, nodeOpts{})
	b := newNode(t, "b", 1<<20, nodeOpts{})
	goMem := make([]byte, 64<<10) // plain Go memory: no memfd to share
	b.register(t, goMem)
	other := newNode(t, "other", 1<<20, nodeOpts{hostID: "another-boot-id"})
	end := b.addr(len(b.buf))
	cases := []struct {
		name   string
		peer   *node
		addr   uint64
		length uint64
		want   bool
	}{
		{"whole buffer", b, b.addr(0), uint64(len(b.buf)), true},
		{"last byte", b, end - 1, 1, true},
		{"other host", other, other.addr(0), 4096, false},
		{"plain Go memory", b, transport.AddrOf(goMem), 4096, false},
		{"past the end", b, end, 1, false},
		{"straddling the end", b, end - 10, 20, false},
		{"before the start", b, b.addr(0) - 4096, 4096, false},
		{"unregistered", b, 0x1000, 4096, false},
		{"wrapping", b, ^uint64(0) - 10, 20, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.peer.peer()
			if got := a.tr.Accepts(p, tc.addr, tc.length); got != tc.want {
				t.Fatalf("Accepts = %v, want %v", got, tc.want)
			}
			if tc.want || tc.peer == other {
				return
			}
			// Submitting anyway fails cleanly, touching nothing.
			r := do(t, a.tr, p, transport.Write, a.buf[:min(tc.length, 4096)], tc.addr)
			if !errors.Is(r.err, transport.ErrOutOfBounds) {
				t.Fatalf("Submit: err = %v, want ErrOutOfBounds", r.err)
			}
		})
	}
	if got := other.mapped(t); got != 1 {
		t.Fatalf("a peer on another host got mapped (%d mappings)", got)
	}
	// A peer never opened by Accepts is unreachable, not a crash.
	c := newNode(t, "c", 1<<20, nodeOpts{})
	if r := do(t, a.tr, c.peer(), transport.Read, a.buf[:8], c.addr(0)); !errors.Is(r.err, transport.ErrUnreachable) {
		t.Fatalf("Submit before Accepts: err = %v", r.err)
	}
}

func TestPeerCredentials(t *testing.T) {
	me := uint32(os.Getuid())
	cases := []struct {
		name string
		uid  uint32 // the target's idea of its own uid
		cfg  shm.Config
		want bool
	}{
		{"same uid", me, shm.Config{}, true},
		{"other uid", me + 1, shm.Config{}, false},
		{"other uid, ours allowed", me + 1, shm.Config{AllowUIDs: []uint32{me + 7, me}}, true},
		{"other uid, others allowed", me + 1, shm.Config{AllowUIDs: []uint32{me + 7}}, false},
		{"any uid allowed", me + 1, shm.Config{AllowAnyUID: true}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newNode(t, "a", 1<<20, nodeOpts{})
			b := newNode(t, "b", 1<<20, nodeOpts{cfg: tc.cfg, beforeStart: func(tr *shm.Transport) { shm.SetUID(tr, tc.uid) }})
			before := b.mapped(t)
			if got := a.tr.Accepts(b.peer(), b.addr(0), 4096); got != tc.want {
				t.Fatalf("Accepts = %v, want %v", got, tc.want)
			}
			after := b.mapped(t)
			if tc.want {
				if after <= before {
					t.Fatal("accepted peer mapped nothing")
				}
				return
			}
			if after != before {
				t.Fatalf("refused peer mapped the target's memory (%d -> %d mappings)", before, after)
			}
			if r := do(t, a.tr, b.peer(), transport.Read, a.buf[:8], b.addr(0)); r.err == nil {
				t.Fatal("refused peer read the target's memory")
			}
			// A raw client is told why, then cut off (the server speaks
			// first: a request would arrive at a closing socket).
			c := rawDial(t, b)
			m, fds := rawRecv(t, c)
			if m == nil || m.Op != "error" || !strings.Contains(m.Error, "uid") || len(fds) != 0 {
				t.Fatalf("refused client got %+v with %d fds", m, len(fds))
			}
			if m, _ := rawRecv(t, c); m != nil {
				t.Fatalf("refused client got %+v after the error", m)
			}
		})
	}
}

func TestRegionsRegisteredLater(t *testing.T) {
	a := newNode(t, "a", 1<<20, nodeOpts{})
	b := newNode(t, "b", 1<<20, nodeOpts{})
	pb := b.peer()
	if !a.tr.Accepts(pb, b.addr(0), 1) {
		t.Fatal("first buffer not accepted")
	}
	later := b.addPool(t, 2<<20, 1<<20)
	addr := transport.AddrOf(later)
	if !a.tr.Accepts(pb, addr+100, 1<<20) {
		t.Fatal("buffer registered after the first listing not accepted")
	}
	testutil.Fill(a.buf, 1)
	if r := do(t, a.tr, pb, transport.Write, a.buf, addr+100); r.err != nil {
		t.Fatal(r.err)
	}
	if !bytes.Equal(later[100:100+len(a.buf)], a.buf) {
		t.Fatal("write to the later buffer did not land")
	}
}

// TestManyRegions lists more regions (1000) and memfds (250) than one
// control packet carries (800 regions, 200 fds).
func TestManyRegions(t *testing.T) {
	const pools, perPool, size = 250, 4, 4096
	a := newNode(t, "a", 1<<20, nodeOpts{})
	b := newNode(t, "b", 0, nodeOpts{})
	var regions [][]byte
	for range pools {
		p, err := mempool.New(mempool.Options{Size: mempool.MinSlabSize, SlabSize: mempool.MinSlabSize, Name: poolName()})
		if err != nil {
			t.Fatal(err)
		}
		b.pools = append(b.pools, p)
		for range perPool {
			r, err := p.Alloc(size)
			if err != nil {
				t.Fatal(err)
			}
			b.register(t, r)
			regions = append(regions, r)
		}
	}
	pb := b.peer()
	if len(pb.Desc().Crescent.ShmBuffers) != pools*perPool {
		t.Fatalf("descriptor lists %d shareable buffers", len(pb.Desc().Crescent.ShmBuffers))
	}
	for i, r := range regions {
		addr := transport.AddrOf(r)
		if !a.tr.Accepts(pb, addr, size) {
			t.Fatalf("region %d of %d not accepted", i, len(regions))
		}
		src := a.buf[:size]
		testutil.Fill(src, uint64(i))
		if res := do(t, a.tr, pb, transport.Write, src, addr); res.err != nil {
			t.Fatalf("region %d: %v", i, res.err)
		}
		if !bytes.Equal(r, src) {
			t.Fatalf("region %d: write landed elsewhere: %s", i, testutil.FirstDiff(r, src))
		}
	}
	for i, r := range regions {
		dst := a.buf[size : 2*size]
		if res := do(t, a.tr, pb, transport.Read, dst, transport.AddrOf(r)); res.err != nil || !bytes.Equal(dst, r) {
			t.Fatalf("region %d: read back: %v", i, res.err)
		}
	}
}

// TestRevoke: BeforeUnregister makes the peer unmap, after its copy in
// progress finished; afterwards the range is refused.
func TestRevoke(t *testing.T) {
	const size = 64 << 20
	a := newNode(t, "a", 0, nodeOpts{})
	srcs := [2][]byte{a.addPool(t, size, 16<<20), a.addPool(t, size, 16<<20)}
	for i, s := range srcs {
		for j := range s {
			s[j] = byte(0x11 * (i + 1))
		}
	}
	b := newNode(t, "b", size, nodeOpts{})
	keep := b.addPool(t, 1<<20, 1<<20) // a second buffer the revoke must not touch
	pb := b.peer()
	if !a.tr.Accepts(pb, b.addr(0), size) || !a.tr.Accepts(pb, transport.AddrOf(keep), 1<<20) {
		t.Fatal("not accepted")
	}
	base := b.mapped(t)

	// Copy 64 MiB after 64 MiB until the range goes away.
	started := make(chan struct{})
	stopped := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			r := do(t, a.tr, pb, transport.Write, srcs[i%2], b.addr(0))
			if i == 0 {
				close(started)
			}
			if r.err != nil {
				stopped <- r.err
				return
			}
		}
	}()
	<-started
	if err := b.tr.BeforeUnregister(context.Background(), b.addr(0), size); err != nil {
		t.Fatal(err)
	}
	// No copy may touch the buffer any more: its bytes are stable.
	snap := bytes.Clone(b.buf)
	var err error
	select {
	case err = <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("copies still succeed after the revoke")
	}
	if !errors.Is(err, transport.ErrOutOfBounds) {
		t.Fatalf("copy after revoke: err = %v, want ErrOutOfBounds", err)
	}
	if !bytes.Equal(b.buf, snap) {
		t.Fatal("a copy wrote into the buffer after BeforeUnregister returned")
	}
	if b.buf[0] != 0x11 && b.buf[0] != 0x22 {
		t.Fatalf("no copy ever landed (%#x)", b.buf[0])
	}
	if got := b.mapped(t); got >= base {
		t.Fatalf("peer still maps the revoked buffer (%d mappings, %d before)", got, base)
	}
	// The buffer is still registered until the engine removes it: the
	// peer must not map it again meanwhile.
	if a.tr.Accepts(pb, b.addr(0), 1) {
		t.Fatal("Accepts = true for a revoked buffer")
	}
	if r := do(t, a.tr, pb, transport.Read, srcs[0][:10], b.addr(0)); !errors.Is(r.err, transport.ErrOutOfBounds) {
		t.Fatalf("read after revoke: err = %v", r.err)
	}
	if _, err := b.reg.Remove(context.Background(), b.addr(0)); err != nil {
		t.Fatal(err)
	}
	if a.tr.Accepts(pb, b.addr(0), 1) {
		t.Fatal("Accepts = true for an unregistered buffer")
	}
	// The other buffer is untouched.
	if !a.tr.Accepts(pb, transport.AddrOf(keep), 1<<20) {
		t.Fatal("revoking one buffer lost another")
	}
	if r := do(t, a.tr, pb, transport.Write, srcs[0][:1<<20], transport.AddrOf(keep)); r.err != nil || keep[0] != 0x11 {
		t.Fatalf("write to the other buffer: %v", r.err)
	}
}

// TestRevokeRacesList revokes while the peer lists again and again: a
// listing that crossed the revoke must not map the buffer again.
func TestRevokeRacesList(t *testing.T) {
	a := newNode(t, "a", 1<<20, nodeOpts{})
	b := newNode(t, "b", 0, nodeOpts{})
	pb := b.peer()
	for i := range 200 {
		buf := b.addPool(t, 64<<10, 64<<10)
		addr := transport.AddrOf(buf)
		if !a.tr.Accepts(pb, addr, 1) {
			t.Fatal("not accepted")
		}
		// A new buffer the peer does not know yet, so Accepts lists again.
		fresh := b.addPool(t, 64<<10, 64<<10)
		done := make(chan struct{})
		go func() {
			defer close(done)
			a.tr.Accepts(pb, transport.AddrOf(fresh), 1)
		}()
		if err := b.unregister(t, buf); err != nil {
			t.Fatal(err)
		}
		<-done
		if a.tr.Accepts(pb, addr, 1) {
			t.Fatalf("round %d: peer maps a buffer the target unregistered", i)
		}
		if r := do(t, a.tr, pb, transport.Write, a.buf[:16], addr); r.err == nil {
			t.Fatalf("round %d: peer wrote into unregistered memory", i)
		}
	}
}

// TestRevokeTimeout: a peer that never confirms is cut off when the
// timeout expires, and does not make other peers miss theirs.
func TestRevokeTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	a := newNode(t, "a", 1<<20, nodeOpts{})
	b := newNode(t, "b", 1<<20, nodeOpts{cfg: shm.Config{RevokeTimeout: timeout}})
	keep := b.addPool(t, 1<<20, 1<<20)
	pb := b.peer()
	// The well-behaved peer connects both before and after the silent
	// one, so whichever the target asks first, the test sees the effect.
	if !a.tr.Accepts(pb, b.addr(0), 1) {
		t.Fatal("not accepted")
	}
	silent := rawDial(t, b)
	rawSend(t, silent, []byte(`{"op":"list"}`), nil)
	for {
		m, fds := rawRecv(t, silent)
		closeFDs(fds)
		if m == nil || m.Op != "regions" {
			t.Fatalf("list reply %+v", m)
		}
		if !m.More {
			break
		}
	}
	a2 := newNode(t, "a2", 1<<20, nodeOpts{})
	if !a2.tr.Accepts(pb, b.addr(0), 1) {
		t.Fatal("not accepted")
	}

	start := time.Now()
	err := b.tr.BeforeUnregister(context.Background(), b.addr(0), uint64(len(b.buf)))
	if err == nil {
		t.Fatal("BeforeUnregister succeeded although a peer never confirmed")
	}
	if d := time.Since(start); d < timeout {
		t.Fatalf("gave up after %v, before the %v timeout", d, timeout)
	}
	// The silent peer got the revoke, then was disconnected.
	m, fds := rawRecv(t, silent)
	closeFDs(fds)
	if m == nil || m.Op != "revoke" || m.Addr != b.addr(0) || m.Len != uint64(len(b.buf)) {
		t.Fatalf("silent peer got %+v", m)
	}
	if m, _ := rawRecv(t, silent); m != nil {
		t.Fatalf("silent peer still connected: got %+v", m)
	}
	// It may still write into the buffer until its end closes: the error
	// says when that happened.
	var ue *transport.UnconfirmedError
	if !errors.As(err, &ue) || len(ue.Released) != 1 {
		t.Fatalf("want one unconfirmed peer, got %v", err)
	}
	select {
	case <-ue.Released[0]:
		t.Fatal("released while the silent peer's connection is open")
	default:
	}
	silent.Close()
	select {
	case <-ue.Released[0]:
	case <-time.After(10 * time.Second):
		t.Fatal("not released after the silent peer closed its connection")
	}
	// The others answered in time: they lost that buffer only.
	for _, p := range []*node{a, a2} {
		if p.tr.Accepts(pb, b.addr(0), 1) {
			t.Fatalf("%s still maps the revoked buffer", p.name)
		}
		if !p.tr.Accepts(pb, transport.AddrOf(keep), 1) {
			t.Fatalf("%s was disconnected although it confirmed in time", p.name)
		}
	}
}

// TestMalformedControl: a bad packet ends that connection only; fds a
// client attaches are closed.
func TestMalformedControl(t *testing.T) {
	a := newNode(t, "a", 1<<20, nodeOpts{})
	b := newNode(t, "b", 1<<20, nodeOpts{})
	cases := []struct {
		name string
		pkt  []byte
		fds  int
		// reply is the op the server answers with before closing, if any.
		reply string
	}{
		{"garbage", []byte("not json at all"), 0, ""},
		{"wrong types", []byte(`{"op":5}`), 0, ""},
		{"truncated json", []byte(`{"op":"li`), 0, ""},
		{"unknown op", []byte(`{"op":"format-disk"}`), 0, "error"},
		{"empty op", []byte(`{}`), 0, "error"},
		{"oversized packet", append([]byte(`{"op":"list","x":"`), bytes.Repeat([]byte("a"), 70<<10)...), 0, ""},
		{"list with fds attached", []byte(`{"op":"list"}`), 3, ""},
		{"garbage with fds attached", []byte("\x00\x01"), 5, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fdsBefore := testutil.CountFDs(t)
			c := rawDial(t, b)
			var fds []int
			for range tc.fds {
				fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
				if err != nil {
					t.Fatal(err)
				}
				fds = append(fds, fd)
			}
			rawSend(t, c, tc.pkt, fds)
			closeFDs(fds) // the server holds its own copies now
			m, got := rawRecv(t, c)
			closeFDs(got)
			if tc.reply != "" {
				if m == nil || m.Op != tc.reply {
					t.Fatalf("reply %+v, want op %q", m, tc.reply)
				}
				m, _ = rawRecv(t, c)
			}
			if m != nil {
				t.Fatalf("connection still served after a malformed packet: %+v", m)
			}
			c.Close()
			testutil.Eventually(t, "fds sent by the client to be closed", func() bool { return testutil.CountFDs(t) <= fdsBefore })
			// The server still serves others.
			if !a.tr.Accepts(b.peer(), b.addr(0), 1) {
				t.Fatal("server stopped serving after a malformed packet")
			}
		})
	}
	t.Run("stray revoked is ignored", func(t *testing.T) {
		c := rawDial(t, b)
		rawSend(t, c, []byte(`{"op":"revoked","id":12345}`), nil)
		rawSend(t, c, []byte(`{"op":"list"}`), nil)
		m, fds := rawRecv(t, c)
		closeFDs(fds)
		if m == nil || m.Op != "regions" || len(m.Regions) != 1 || len(fds) != 1 {
			t.Fatalf("list after a stray revoked: %+v with %d fds", m, len(fds))
		}
	})
}

// TestTargetDies: when the target closes, the peer unmaps its memory.
func TestTargetDies(t *testing.T) {
	a := newNode(t, "a", 1<<20, nodeOpts{})
	b := newNode(t, "b", 1<<20, nodeOpts{})
	pb := b.peer()
	base := b.mapped(t)
	if !a.tr.Accepts(pb, b.addr(0), 1) {
		t.Fatal("not accepted")
	}
	if b.mapped(t) <= base {
		t.Fatal("nothing mapped")
	}
	if err := b.tr.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the peer to unmap a dead target", func() bool { return b.mapped(t) == base })
	if a.tr.Accepts(pb, b.addr(0), 1) {
		t.Fatal("Accepts = true for a dead target")
	}
	if r := do(t, a.tr, pb, transport.Write, a.buf[:8], b.addr(0)); r.err == nil {
		t.Fatal("write to a dead target succeeded")
	}
}

// TestSealing: a peer cannot resize the memfds it receives (a shrink
// would make the owner's own accesses fault).
func TestSealing(t *testing.T) {
	t.Run("mempool memfd", func(t *testing.T) {
		b := newNode(t, "b", 1<<20, nodeOpts{})
		seals, err := unix.FcntlInt(uintptr(b.pools[0].Fd()), unix.F_GET_SEALS, 0)
		if err != nil {
			t.Fatal(err)
		}
		if seals&unix.F_SEAL_SEAL != 0 {
			t.Fatal("mempool creates its memfd without MFD_ALLOW_SEALING, so shm cannot seal it: a peer could shrink the pool's memfd")
		}
		checkSealed(t, b)
	})
	t.Run("sealable memfd", func(t *testing.T) {
		const size = 1 << 20
		b := newNode(t, "b", 0, nodeOpts{})
		fd, err := unix.MemfdCreate("crescent-shm-test-sealable", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, size); err != nil {
			t.Fatal(err)
		}
		mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			b.close()
			unix.Munmap(mem)
			unix.Close(fd)
		})
		if _, err := b.reg.Add(mem, "cpu:0", fd, 0, size); err != nil {
			t.Fatal(err)
		}
		checkSealed(t, b)
		// The owner's view of the size is unchanged.
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Size != size {
			t.Fatalf("memfd size %d (%v)", st.Size, err)
		}
	})
}

// checkSealed lists b's regions as a raw client and tries to resize the
// memfd it receives.
func checkSealed(t *testing.T, b *node) {
	t.Helper()
	c := rawDial(t, b)
	rawSend(t, c, []byte(`{"op":"list"}`), nil)
	m, fds := rawRecv(t, c)
	defer closeFDs(fds)
	if m == nil || m.Op != "regions" || len(fds) != 1 {
		t.Fatalf("list reply %+v with %d fds", m, len(fds))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fds[0], &st); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int64{4096, st.Size * 2} {
		if err := unix.Ftruncate(fds[0], size); !errors.Is(err, unix.EPERM) {
			t.Fatalf("ftruncate(%d) of a shared memfd: %v, want EPERM", size, err)
		}
	}
}

// TestNoLeaks maps, copies, revokes and closes, then checks that fds and
// goroutines are back where they were.
func TestNoLeaks(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	before := testutil.CountFDs(t)
	for range 3 {
		a := startNode(t, "a", 1<<20, nodeOpts{})
		b := startNode(t, "b", 1<<20, nodeOpts{})
		extra := b.addPool(t, 1<<20, 1<<20)
		pb := b.peer()
		if !a.tr.Accepts(pb, b.addr(0), 1) || !a.tr.Accepts(pb, transport.AddrOf(extra), 1) {
			t.Fatal("not accepted")
		}
		if r := do(t, a.tr, pb, transport.Write, a.buf, b.addr(0)); r.err != nil {
			t.Fatal(r.err)
		}
		if err := b.unregister(t, extra); err != nil {
			t.Fatal(err)
		}
		a.tr.ClosePeer(b.name)
		a.close()
		b.close()
	}
	goleak.VerifyNone(t, leaks)
	if after := testutil.CountFDs(t); after != before {
		t.Fatalf("fds: %d before, %d after", before, after)
	}
}

// TestRevokeCrossesListing: the target sends a listing and, right after,
// a revoke of a region in it. The peer handles the revoke while it is
// still mapping the listing; it must not keep that region mapped.
func TestRevokeCrossesListing(t *testing.T) {
	const size = 128 << 20 // slow to map (prefaulted), so the revoke wins
	const addr = 0x7e0000000000
	a := newNode(t, "a", 1<<20, nodeOpts{})
	f := newFakeTarget(t)
	name := fmt.Sprintf("crescent-shm-test-fake-%d", os.Getpid())
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	mapped := func() int {
		data, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(data), "/memfd:"+name+" (deleted)")
	}
	p := f.peer("fake", addr, size)
	accepted := make(chan bool, 1)
	go func() { accepted <- a.tr.Accepts(p, addr, 1) }()

	c := f.accept(t)
	if m, _ := rawRecv(t, c); m == nil || m.Op != "list" {
		t.Fatalf("first packet %+v", m)
	}
	rawSend(t, c, []byte(fmt.Sprintf(`{"op":"regions","version":1,"regions":[{"addr":%d,"len":%d,"fd":0,"off":0}]}`, addr, size)), []int{fd})
	rawSend(t, c, []byte(fmt.Sprintf(`{"op":"revoke","id":7,"addr":%d,"len":%d}`, addr, size)), nil)
	for {
		m, fds := rawRecv(t, c)
		closeFDs(fds)
		if m == nil {
			t.Fatal("peer hung up")
		}
		if m.Op == "revoked" && m.ID == 7 {
			break
		}
		if m.Op == "list" { // Accepts lists again: the region is gone
			rawSend(t, c, []byte(`{"op":"regions","version":2}`), nil)
		}
	}
	// Answer further listings until the peer hangs up.
	served := answerLists(c, func(uint64) string { return `{"op":"regions","version":2}` })
	ok := <-accepted
	n := mapped()
	a.tr.ClosePeer("fake")
	<-served
	if ok {
		t.Fatal("peer accepts a region revoked while it was listing")
	}
	if n != 0 {
		t.Fatalf("peer keeps %d mappings of a region it confirmed as unmapped", n)
	}
}

// TestAbortedTask: a task aborted before its copy ends without copying.
func TestAbortedTask(t *testing.T) {
	a := newNode(t, "a", 1<<20, nodeOpts{})
	b := newNode(t, "b", 1<<20, nodeOpts{})
	pb := b.peer()
	if !a.tr.Accepts(pb, b.addr(0), 1) {
		t.Fatal("not accepted")
	}
	clear(b.buf[:4096])
	testutil.Fill(a.buf[:4096], 1)
	var got []error
	done := func(_ *transport.Task, _ int, err error) { got = append(got, err) }
	aborted := transport.NewTask(transport.Write, a.buf[:4096], b.addr(0), time.Now().Add(time.Minute), done)
	aborted.Abort()
	ok := transport.NewTask(transport.Write, a.buf[:8], b.addr(8192), time.Now().Add(time.Minute), done)
	a.tr.Submit(pb, []*transport.Task{aborted, ok})
	if len(got) != 2 || !errors.Is(got[0], transport.ErrTimeout) || got[1] != nil {
		t.Fatalf("completions %v", got)
	}
	if !bytes.Equal(b.buf[:4096], make([]byte, 4096)) {
		t.Fatal("aborted task copied")
	}
}

// TestPeerSideClose: ClosePeer and Close unmap the target's memory.
func TestPeerSideClose(t *testing.T) {
	for _, how := range []string{"ClosePeer", "Close"} {
		t.Run(how, func(t *testing.T) {
			a := newNode(t, "a", 1<<20, nodeOpts{})
			b := newNode(t, "b", 1<<20, nodeOpts{})
			pb := b.peer()
			base := b.mapped(t)
			if !a.tr.Accepts(pb, b.addr(0), 1) || b.mapped(t) <= base {
				t.Fatal("not mapped")
			}
			if how == "Close" {
				a.tr.Close()
			} else {
				a.tr.ClosePeer(b.name)
			}
			if got := b.mapped(t); got != base {
				t.Fatalf("%d mappings left after %s", got-base, how)
			}
			if r := do(t, a.tr, pb, transport.Write, a.buf[:8], b.addr(0)); r.err == nil {
				t.Fatalf("write after %s succeeded", how)
			}
			if how == "ClosePeer" && !a.tr.Accepts(pb, b.addr(0), 1) {
				t.Fatal("peer not usable again after ClosePeer")
			}
		})
	}
}
