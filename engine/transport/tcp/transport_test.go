package tcp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/crescent-kv/crescent/internal/testutil"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/tcp"
)

// node is one TCP transport serving one registered buffer from a memfd
// pool, as an engine would run it.
type node struct {
	name string
	tr   *tcp.Transport
	reg  *transport.Registry
	pool *mempool.Pool
	buf  []byte
	once sync.Once
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newNode(tb testing.TB, name string, size int, cfg tcp.Config) *node {
	tb.Helper()
	n := startNode(tb, name, size, cfg)
	tb.Cleanup(n.close)
	return n
}

// startNode is newNode without the cleanup, for tests that count fds.
func startNode(tb testing.TB, name string, size int, cfg tcp.Config) *node {
	tb.Helper()
	return startNodeLog(tb, name, size, cfg, quiet)
}

func startNodeLog(tb testing.TB, name string, size int, cfg tcp.Config, log *slog.Logger) *node {
	tb.Helper()
	pool, err := mempool.New(mempool.Options{Size: int64(size), SlabSize: 1 << 20, Name: "crescent-tcp-test"})
	if err != nil {
		tb.Fatal(err)
	}
	buf, err := pool.Alloc(size)
	if err != nil {
		pool.Close()
		tb.Fatal(err)
	}
	reg := transport.NewRegistry()
	fd, off, p, ok := mempool.Lookup(buf)
	if !ok {
		pool.Close()
		tb.Fatal("mempool.Lookup: buffer not found")
	}
	if _, err := reg.Add(buf, "cpu:0", fd, off, p.Size()); err != nil {
		pool.Close()
		tb.Fatal(err)
	}
	tr := tcp.New(cfg)
	if err := tr.Start(transport.Env{LocalName: name, Host: "127.0.0.1", HostID: "same", Registry: reg, Logger: log}); err != nil {
		reg.Close()
		pool.Close()
		tb.Fatal(err)
	}
	return &node{name: name, tr: tr, reg: reg, pool: pool, buf: buf}
}

func (n *node) close() {
	n.once.Do(func() {
		n.tr.Close()
		n.reg.Close()
		n.pool.Close()
	})
}

func (n *node) addr(off int) uint64 { return transport.AddrOf(n.buf) + uint64(off) }

// desc is what engine.LocalDesc publishes for this node.
func (n *node) desc() *metadata.SegmentDesc {
	d := &metadata.SegmentDesc{Name: n.name, Protocol: "tcp", Crescent: &metadata.Extension{Version: 1, HostID: "same"}}
	for _, r := range n.reg.Regions() {
		d.Buffers = append(d.Buffers, metadata.Buffer{Name: r.Location, Addr: r.Addr, Length: r.Len()})
	}
	n.tr.Describe(d)
	return d
}

func (n *node) peer() transport.Peer { return &testPeer{name: n.name, desc: n.desc} }

// testPeer is an opened segment whose descriptor comes from a function.
type testPeer struct {
	name string
	desc func() *metadata.SegmentDesc
}

func (p *testPeer) Name() string                { return p.name }
func (p *testPeer) Desc() *metadata.SegmentDesc { return p.desc() }
func (p *testPeer) Refresh(context.Context) (*metadata.SegmentDesc, error) {
	return p.desc(), nil
}

// rawBase is the buffer address hand-written targets advertise.
const rawBase = 0x10000000

// rawPeer describes a hand-written target listening on port.
func rawPeer(name string, port, version int) transport.Peer {
	return &testPeer{name: name, desc: func() *metadata.SegmentDesc {
		return &metadata.SegmentDesc{Name: name, Protocol: "tcp", TCPDataPort: port, TCPProtoVersion: version, TCPDataHost: "127.0.0.1",
			Buffers: []metadata.Buffer{{Name: "cpu:0", Addr: rawBase, Length: 1 << 30}}}
	}}
}

// result is one task completion.
type result struct {
	task *transport.Task
	n    int
	err  error
	at   time.Time
}

// collector makes tasks whose completions land on one channel.
type collector struct{ ch chan result }

func newCollector() *collector { return &collector{ch: make(chan result, 1<<14)} }

func (c *collector) task(op transport.Op, local []byte, remote uint64, deadline time.Time) *transport.Task {
	return transport.NewTask(op, local, remote, deadline, func(t *transport.Task, n int, err error) {
		c.ch <- result{task: t, n: n, err: err, at: time.Now()}
	})
}

// wait returns the next k completions, failing the test if they do not
// all arrive within 30s (every task must end by its deadline).
func (c *collector) wait(tb testing.TB, k int) []result {
	tb.Helper()
	out := make([]result, 0, k)
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for len(out) < k {
		select {
		case r := <-c.ch:
			out = append(out, r)
		case <-timeout.C:
			tb.Fatalf("%d of %d tasks still pending after 30s", k-len(out), k)
		}
	}
	return out
}

// none fails if a task completed more often than waited for.
func (c *collector) none(tb testing.TB) {
	tb.Helper()
	select {
	case r := <-c.ch:
		tb.Fatalf("extra completion of task %p: n=%d err=%v", r.task, r.n, r.err)
	default:
	}
}

func byTask(rs []result) map[*transport.Task]result {
	m := make(map[*transport.Task]result, len(rs))
	for _, r := range rs {
		m[r.task] = r
	}
	return m
}

func soon() time.Time { return time.Now().Add(30 * time.Second) }

var ops = []transport.Op{transport.Write, transport.Read}

func TestRoundTrip(t *testing.T) {
	sizes := []int{1, 7, 4095, 64<<10 - 1, 64 << 10, 64<<10 + 1, 1<<20 + 13, 5<<20 + 3}
	for _, v := range []struct {
		name    string
		forceV1 bool
	}{{"v2", false}, {"v1", true}} {
		t.Run(v.name, func(t *testing.T) {
			cfg := tcp.Config{SliceSize: 64 << 10, Lanes: 3, ForceV1: v.forceV1}
			a := newNode(t, "a", 8<<20, cfg)
			b := newNode(t, "b", 8<<20, cfg)
			pb := b.peer()
			c := newCollector()
			for i, size := range sizes {
				for _, op := range ops {
					t.Run(fmt.Sprintf("%s/%d", op, size), func(t *testing.T) {
						// Odd offsets: nothing may assume alignment.
						local := a.buf[3 : 3+size]
						roff := 5 + i
						remote := b.buf[roff : roff+size]
						seed := uint64(2*i) + uint64(op)
						src, dst := local, remote
						if op == transport.Read {
							src, dst = remote, local
						}
						testutil.Fill(src, seed)
						clear(dst)
						before := b.tr.Stats()
						a.tr.Submit(pb, []*transport.Task{c.task(op, local, b.addr(roff), soon())})
						r := c.wait(t, 1)[0]
						if r.err != nil || r.n != size {
							t.Fatalf("n=%d err=%v, want %d bytes", r.n, r.err, size)
						}
						moved := func() uint64 {
							s := b.tr.Stats()
							if op == transport.Write {
								return s.ServerBytesIn - before.ServerBytesIn
							}
							return s.ServerBytesOut - before.ServerBytesOut
						}
						if op == transport.Write && v.forceV1 {
							// A v1 WRITE completes once sent: wait until it landed.
							testutil.Eventually(t, "v1 write to land", func() bool { return moved() >= uint64(size) })
						}
						if !bytes.Equal(dst, src) {
							t.Fatalf("data differs: %s", testutil.FirstDiff(dst, src))
						}
						// Every byte crossed once: nothing was sent twice.
						testutil.Eventually(t, "server counters", func() bool { return moved() >= uint64(size) })
						if got := moved(); got != uint64(size) {
							t.Fatalf("server moved %d bytes for a %d-byte request", got, size)
						}
					})
				}
			}
			c.none(t)
		})
	}
}

// TestManyTasksOneSubmit checks that slices of many requests spread over
// lanes, pipelined beyond the window, land in the right places.
func TestManyTasksOneSubmit(t *testing.T) {
	for _, v := range []struct {
		name    string
		forceV1 bool
	}{{"v2", false}, {"v1", true}} {
		t.Run(v.name, func(t *testing.T) {
			cfg := tcp.Config{SliceSize: 32 << 10, Lanes: 4, Window: 8, ForceV1: v.forceV1}
			a := newNode(t, "a", 24<<20, cfg)
			b := newNode(t, "b", 24<<20, cfg)
			pb := b.peer()
			c := newCollector()
			rng := rand.New(rand.NewPCG(1, 2))
			type span struct{ loff, roff, n int }
			var spans []span
			loff, roff := 0, 0
			for i := 0; i < 200; i++ {
				n := 1 + rng.IntN(100<<10)
				spans = append(spans, span{loff, roff, n})
				loff += n + rng.IntN(64)
				roff += n + rng.IntN(64)
			}
			total := 0
			for _, s := range spans {
				total += s.n
			}

			// All WRITEs in one Submit.
			testutil.Fill(a.buf, 10)
			clear(b.buf)
			in0 := b.tr.Stats().ServerBytesIn
			var tasks []*transport.Task
			for _, s := range spans {
				tasks = append(tasks, c.task(transport.Write, a.buf[s.loff:s.loff+s.n], b.addr(s.roff), soon()))
			}
			a.tr.Submit(pb, tasks)
			for _, r := range c.wait(t, len(tasks)) {
				if r.err != nil || r.n != len(r.task.Local) {
					t.Fatalf("write: n=%d err=%v", r.n, r.err)
				}
			}
			testutil.Eventually(t, "writes to land", func() bool { return b.tr.Stats().ServerBytesIn-in0 >= uint64(total) })
			for i, s := range spans {
				if got, want := b.buf[s.roff:s.roff+s.n], a.buf[s.loff:s.loff+s.n]; !bytes.Equal(got, want) {
					t.Fatalf("write %d: %s", i, testutil.FirstDiff(got, want))
				}
			}

			// All READs in one Submit, into other places.
			testutil.Fill(b.buf, 11)
			clear(a.buf)
			tasks = tasks[:0]
			for _, s := range spans {
				tasks = append(tasks, c.task(transport.Read, a.buf[s.roff:s.roff+s.n], b.addr(s.loff), soon()))
			}
			a.tr.Submit(pb, tasks)
			for _, r := range c.wait(t, len(tasks)) {
				if r.err != nil || r.n != len(r.task.Local) {
					t.Fatalf("read: n=%d err=%v", r.n, r.err)
				}
			}
			for i, s := range spans {
				if got, want := a.buf[s.roff:s.roff+s.n], b.buf[s.loff:s.loff+s.n]; !bytes.Equal(got, want) {
					t.Fatalf("read %d: %s", i, testutil.FirstDiff(got, want))
				}
			}
			c.none(t)
		})
	}
}

func TestRejected(t *testing.T) {
	small := tcp.Config{SliceSize: 64 << 10, Lanes: 2}
	a := newNode(t, "a", 8<<20, small)
	// One 4 MiB slice: the refused payload is larger than socket buffers.
	big := newNode(t, "big", 8<<20, tcp.Config{SliceSize: 4 << 20, Lanes: 2})
	b := newNode(t, "b", 1<<20, small)
	pb := b.peer()
	end := b.addr(len(b.buf))
	cases := []struct {
		name   string
		from   *node
		op     transport.Op
		remote uint64
		size   int
		// rejects is how often the server refuses: 1 for one slice, since
		// a refused slice is never retried; 0 means at least once.
		rejects uint64
	}{
		{"write past end", a, transport.Write, end - 10, 100, 1},
		{"read past end", a, transport.Read, end - 10, 100, 1},
		{"write unregistered", a, transport.Write, 0x1000, 4096, 1},
		{"read before start", a, transport.Read, b.addr(0) - 4096, 4096, 1},
		{"read wrapping", a, transport.Read, ^uint64(0) - 10, 100, 1},
		{"big write past end", big, transport.Write, b.addr(0), 4 << 20, 1},
		{"sliced write straddling end", a, transport.Write, end - 100<<10, 300 << 10, 0},
		{"sliced read straddling end", a, transport.Read, end - 100<<10, 300 << 10, 0},
	}
	c := newCollector()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := b.tr.Stats().Rejected
			tc.from.tr.Submit(pb, []*transport.Task{c.task(tc.op, tc.from.buf[:tc.size], tc.remote, soon())})
			r := c.wait(t, 1)[0]
			if !errors.Is(r.err, transport.ErrRejected) {
				t.Fatalf("err = %v, want ErrRejected", r.err)
			}
			got := b.tr.Stats().Rejected - before
			if tc.rejects != 0 && got != tc.rejects || got == 0 {
				t.Fatalf("server counted %d rejections, want %d", got, tc.rejects)
			}
			// The peer stays usable: later requests open new connections.
			testutil.Fill(tc.from.buf[:8192], 3)
			tc.from.tr.Submit(pb, []*transport.Task{
				c.task(transport.Write, tc.from.buf[:8192], b.addr(100), soon()),
				c.task(transport.Read, tc.from.buf[8192:16384], b.addr(100), soon()),
			})
			for _, r := range c.wait(t, 2) {
				if r.err != nil {
					t.Fatalf("valid request after a rejection: %v", r.err)
				}
			}
			if !bytes.Equal(b.buf[100:100+8192], tc.from.buf[:8192]) {
				t.Fatal("valid write after a rejection did not land")
			}
		})
	}
	c.none(t)
}

// TestRejectedV1 checks that a v1 READ of an unregistered range fails:
// v1 has no status words, so the client only sees the connection close,
// retries once and gives up.
func TestRejectedV1(t *testing.T) {
	cfg := tcp.Config{ForceV1: true, Lanes: 1}
	a := newNode(t, "a", 1<<20, cfg)
	b := newNode(t, "b", 1<<20, cfg)
	c := newCollector()
	a.tr.Submit(b.peer(), []*transport.Task{c.task(transport.Read, a.buf[:100], b.addr(len(b.buf)-10), soon())})
	r := c.wait(t, 1)[0]
	if !errors.Is(r.err, transport.ErrPeerGone) {
		t.Fatalf("err = %v, want ErrPeerGone", r.err)
	}
	if got := b.tr.Stats().Rejected; got != 2 {
		t.Fatalf("server counted %d rejections, want 2 (one retry)", got)
	}
	c.none(t)
}

// viaProxy is b's descriptor with the data port of px.
func viaProxy(b *node, px *testutil.Proxy) transport.Peer {
	return &testPeer{name: b.name, desc: func() *metadata.SegmentDesc {
		d := b.desc()
		d.TCPDataPort = px.Port()
		return d
	}}
}

// TestBrokenConnection cuts the connections in the middle of a transfer:
// slices in flight are sent again on a new connection and succeed if the
// target is still there, or fail with ErrPeerGone if not; none hangs.
func TestBrokenConnection(t *testing.T) {
	const total, block = 24 << 20, 3 << 20
	cases := []struct {
		lanes int
		back  bool
		op    transport.Op
	}{
		// With several lanes the cut breaks them all at once: a retried
		// slice must go to a new connection, not to a sibling lane the
		// same cut broke but that has not noticed yet.
		{1, true, transport.Write}, {1, true, transport.Read},
		{4, true, transport.Write}, {4, true, transport.Read},
		{4, false, transport.Write}, {4, false, transport.Read},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s/lanes=%d/target-back=%v", tc.op, tc.lanes, tc.back), func(t *testing.T) {
			cfg := tcp.Config{Lanes: tc.lanes, SliceSize: 128 << 10}
			a := newNode(t, "a", total, cfg)
			b := newNode(t, "b", total, cfg)
			px := testutil.NewProxy(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(b.tr.Port())))
			if tc.back {
				px.TripAfter(4<<20, px.Reset)
			} else {
				px.TripAfter(4<<20, px.Stop)
			}
			src, dst := a.buf, b.buf
			if tc.op == transport.Read {
				src, dst = b.buf, a.buf
			}
			testutil.Fill(src, 7)
			clear(dst)
			c := newCollector()
			var tasks []*transport.Task
			for off := 0; off < total; off += block {
				tasks = append(tasks, c.task(tc.op, a.buf[off:off+block], b.addr(off), time.Now().Add(60*time.Second)))
			}
			a.tr.Submit(viaProxy(b, px), tasks)
			rs := c.wait(t, len(tasks))
			if px.Trips() != 1 {
				t.Fatal("the connection was never cut")
			}
			failed := 0
			for _, r := range rs {
				switch {
				case r.err == nil && r.n == block:
				case r.err == nil:
					t.Fatalf("success with %d bytes of %d", r.n, block)
				case tc.back:
					t.Fatalf("task failed although the target is reachable: %v", r.err)
				case !errors.Is(r.err, transport.ErrPeerGone):
					t.Fatalf("err = %v, want ErrPeerGone", r.err)
				default:
					failed++
				}
			}
			if tc.back {
				if tc.op == transport.Write {
					testutil.Eventually(t, "writes to land", func() bool { return b.tr.Stats().ServerBytesIn >= total })
				}
				if !bytes.Equal(dst, src) {
					t.Fatalf("data differs after retry: %s", testutil.FirstDiff(dst, src))
				}
			} else if failed == 0 {
				t.Fatal("every task succeeded although the target vanished mid-transfer")
			}
			c.none(t)
		})
	}
}

// stallServer accepts connections and never answers.
type stallServer struct {
	ln    net.Listener
	read  bool // read and drop what arrives, else never read
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newStallServer(tb testing.TB, read bool) *stallServer {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &stallServer{ln: ln, read: read}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			if read {
				s.wg.Add(1)
				go func() {
					defer s.wg.Done()
					io.Copy(io.Discard, c)
				}()
			}
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *stallServer) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

func TestDeadline(t *testing.T) {
	cases := []struct {
		name    string
		reads   bool // the target reads requests (but never answers)
		version int
		op      transport.Op
		size    int
	}{
		{"v2 read, no answer", true, 2, transport.Read, 8},
		{"v2 write, no ack", true, 2, transport.Write, 8},
		{"v1 read, no data", true, 1, transport.Read, 8},
		{"v2 write, target not reading", false, 2, transport.Write, 16 << 20},
		{"v1 write, target not reading", false, 1, transport.Write, 16 << 20},
		{"v2 read, target not reading", false, 2, transport.Read, 4 << 20},
	}
	a := newNode(t, "a", 16<<20, tcp.Config{Lanes: 2})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStallServer(t, tc.reads)
			p := rawPeer("stall", s.port(), tc.version)
			c := newCollector()
			deadline := time.Now().Add(300 * time.Millisecond)
			tasks := []*transport.Task{
				c.task(tc.op, a.buf[:tc.size], rawBase, deadline),
				c.task(tc.op, a.buf[:tc.size], rawBase, deadline),
			}
			a.tr.Submit(p, tasks)
			for _, r := range c.wait(t, len(tasks)) {
				if !errors.Is(r.err, transport.ErrTimeout) {
					t.Fatalf("err = %v, want ErrTimeout", r.err)
				}
				if r.at.Before(deadline) {
					t.Fatalf("timed out %v before the deadline", deadline.Sub(r.at))
				}
				if late := r.at.Sub(deadline); late > 10*time.Second {
					t.Fatalf("timed out %v after the deadline", late)
				}
			}
			a.tr.ClosePeer("stall")
			c.none(t)
		})
	}
}

// TestAbortQueued aborts a task while it waits behind a full window: it
// completes without ever being sent.
func TestAbortQueued(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a := newNode(t, "a", 1<<20, tcp.Config{Lanes: 1, Window: 1})
	p := rawPeer("target", ln.Addr().(*net.TCPAddr).Port, 2)
	c := newCollector()
	task := func(i int) *transport.Task {
		return c.task(transport.Read, a.buf[8*i:8*i+8], rawBase+uint64(8*i), soon())
	}
	t0, t1, t2 := task(0), task(1), task(2)
	a.tr.Submit(p, []*transport.Task{t0, t1, t2})

	ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	expect := func(i int) {
		t.Helper()
		var hb [tcp.HeaderSize]byte
		if _, err := io.ReadFull(conn, hb[:]); err != nil {
			t.Fatalf("waiting for header of task %d: %v", i, err)
		}
		h, err := tcp.ParseHeader(hb[:])
		if err != nil || h.Addr != rawBase+uint64(8*i) || h.Size != 8 || h.Opcode != tcp.OpRead|tcp.V2Flag {
			t.Fatalf("header %+v (%v), want task %d", h, err, i)
		}
	}
	answer := func(i int) {
		t.Helper()
		var b [tcp.StatusSize + 8]byte
		binary.LittleEndian.PutUint64(b[:], tcp.StatusOK)
		copy(b[8:], fmt.Sprintf("task%04d", i))
		if _, err := conn.Write(b[:]); err != nil {
			t.Fatal(err)
		}
	}
	// With a window of one, t0 and t1 are on the wire and t2 waits for t0.
	expect(0)
	expect(1)
	t3 := task(3)
	t3.Abort()
	a.tr.Submit(p, []*transport.Task{t3})
	answer(0)
	expect(2)
	answer(1)
	answer(2)
	rs := byTask(c.wait(t, 4))
	for i, tk := range []*transport.Task{t0, t1, t2} {
		r := rs[tk]
		if r.err != nil || string(tk.Local) != fmt.Sprintf("task%04d", i) {
			t.Fatalf("task %d: err=%v data=%q", i, r.err, tk.Local)
		}
	}
	if r := rs[t3]; !errors.Is(r.err, transport.ErrTimeout) && !errors.Is(r.err, context.Canceled) {
		t.Fatalf("aborted task: err=%v", r.err)
	}
	// The next request on the wire is t4's: t3 never left.
	t4 := task(4)
	a.tr.Submit(p, []*transport.Task{t4})
	expect(4)
	answer(4)
	if r := c.wait(t, 1)[0]; r.err != nil {
		t.Fatal(r.err)
	}
	c.none(t)
}

// TestClose: pending tasks complete with ErrClosed, later ones at once.
func TestClose(t *testing.T) {
	s := newStallServer(t, true)
	a := startNode(t, "a", 1<<20, tcp.Config{Lanes: 2, Window: 4})
	defer a.close()
	p := rawPeer("stall", s.port(), 2)
	c := newCollector()
	var tasks []*transport.Task
	for i := 0; i < 20; i++ {
		tasks = append(tasks, c.task(ops[i%2], a.buf[i*4096:(i+1)*4096], rawBase, time.Now().Add(time.Minute)))
	}
	a.tr.Submit(p, tasks)
	if err := a.tr.Close(); err != nil {
		t.Fatal(err)
	}
	for _, r := range c.wait(t, len(tasks)) {
		if !errors.Is(r.err, transport.ErrClosed) {
			t.Fatalf("err = %v, want ErrClosed", r.err)
		}
	}
	a.tr.Submit(p, []*transport.Task{c.task(transport.Write, a.buf[:10], rawBase, soon())})
	if r := c.wait(t, 1)[0]; !errors.Is(r.err, transport.ErrClosed) {
		t.Fatalf("submit after Close: err = %v", r.err)
	}
	if err := a.tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	c.none(t)
}

// TestNoLeaks runs transfers, a rejection and a broken peer, closes
// everything and checks that fds and goroutines are back where they were.
func TestNoLeaks(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	before := testutil.CountFDs(t)
	for i := 0; i < 3; i++ {
		a := startNode(t, "a", 2<<20, tcp.Config{SliceSize: 64 << 10})
		b := startNode(t, "b", 2<<20, tcp.Config{})
		c := newCollector()
		a.tr.Submit(b.peer(), []*transport.Task{
			c.task(transport.Write, a.buf[:1<<20], b.addr(0), soon()),
			c.task(transport.Read, a.buf[1<<20:], b.addr(0), soon()),
			c.task(transport.Read, a.buf[:10], b.addr(len(b.buf)), soon()),
		})
		rs := c.wait(t, 3)
		fails := 0
		for _, r := range rs {
			if r.err != nil {
				fails++
			}
		}
		if fails != 1 {
			t.Fatalf("%d failures, want 1", fails)
		}
		// A target that goes away with a lane open to it.
		b.close()
		a.tr.Submit(b.peer(), []*transport.Task{c.task(transport.Write, a.buf[:10], b.addr(0), soon())})
		if r := c.wait(t, 1)[0]; r.err == nil {
			t.Fatal("write to a closed target succeeded")
		}
		a.close()
	}
	goleak.VerifyNone(t, leaks)
	// Fewer is fine: a connection of an earlier test may close meanwhile.
	if after := testutil.CountFDs(t); after > before {
		t.Fatalf("fds: %d before, %d after", before, after)
	}
}

// TestFraming checks the opcodes and replies on the wire: v1 (forced, or
// because the target's descriptor says version 1) has no status words and
// a v1 WRITE completes once sent.
func TestFraming(t *testing.T) {
	cases := []struct {
		name    string
		forceV1 bool
		version int
		v2      bool
	}{
		{"v2 target", false, 2, true},
		{"v2 target, ForceV1", true, 2, false},
		{"v1 target", false, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			a := newNode(t, "a", 1<<20, tcp.Config{Lanes: 1, ForceV1: tc.forceV1})
			p := rawPeer("target", ln.Addr().(*net.TCPAddr).Port, tc.version)
			c := newCollector()
			testutil.Fill(a.buf[:100], 1)
			a.tr.Submit(p, []*transport.Task{c.task(transport.Write, a.buf[:100], rawBase+8, soon())})
			ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
			conn, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			flag := uint8(0)
			if tc.v2 {
				flag = tcp.V2Flag
			}
			req := make([]byte, tcp.HeaderSize+100)
			if _, err := io.ReadFull(conn, req); err != nil {
				t.Fatal(err)
			}
			if h, err := tcp.ParseHeader(req); err != nil || h != (tcp.Header{Size: 100, Addr: rawBase + 8, Opcode: tcp.OpWrite | flag}) {
				t.Fatalf("write header %+v (%v)", h, err)
			}
			if !bytes.Equal(req[tcp.HeaderSize:], a.buf[:100]) {
				t.Fatal("write payload differs")
			}
			if tc.v2 {
				// Not complete until acknowledged.
				select {
				case r := <-c.ch:
					t.Fatalf("v2 write completed before its ack: %v", r.err)
				default:
				}
				conn.Write(okStatus())
			}
			if r := c.wait(t, 1)[0]; r.err != nil || r.n != 100 {
				t.Fatalf("write: n=%d err=%v", r.n, r.err)
			}

			clear(a.buf[200:300])
			a.tr.Submit(p, []*transport.Task{c.task(transport.Read, a.buf[200:300], rawBase+16, soon())})
			if _, err := io.ReadFull(conn, req[:tcp.HeaderSize]); err != nil {
				t.Fatal(err)
			}
			if h, err := tcp.ParseHeader(req); err != nil || h != (tcp.Header{Size: 100, Addr: rawBase + 16, Opcode: tcp.OpRead | flag}) {
				t.Fatalf("read header %+v (%v)", h, err)
			}
			data := bytes.Repeat([]byte("0123456789"), 10)
			if tc.v2 {
				conn.Write(okStatus())
			}
			conn.Write(data)
			if r := c.wait(t, 1)[0]; r.err != nil || r.n != 100 || !bytes.Equal(a.buf[200:300], data) {
				t.Fatalf("read: n=%d err=%v data=%q", r.n, r.err, a.buf[200:300])
			}
			c.none(t)
		})
	}
}

// TestClosePeer: tasks pending on a peer that is closed end with
// ErrClosed; the peer can be used again afterwards.
func TestClosePeer(t *testing.T) {
	s := newStallServer(t, true)
	a := newNode(t, "a", 1<<20, tcp.Config{Lanes: 2})
	b := newNode(t, "b", 1<<20, tcp.Config{})
	p := rawPeer("stall", s.port(), 2)
	c := newCollector()
	var tasks []*transport.Task
	for i := range 10 {
		tasks = append(tasks, c.task(ops[i%2], a.buf[:4096], rawBase, time.Now().Add(time.Minute)))
	}
	a.tr.Submit(p, tasks)
	// A real peer alongside is not disturbed.
	a.tr.Submit(b.peer(), []*transport.Task{c.task(transport.Write, a.buf[:4096], b.addr(0), soon())})
	if r := c.wait(t, 1)[0]; r.err != nil {
		t.Fatalf("other peer: %v", r.err)
	}
	a.tr.ClosePeer("stall")
	for _, r := range c.wait(t, len(tasks)) {
		if !errors.Is(r.err, transport.ErrClosed) {
			t.Fatalf("err = %v, want ErrClosed", r.err)
		}
	}
	a.tr.ClosePeer(b.name)
	a.tr.Submit(b.peer(), []*transport.Task{c.task(transport.Read, a.buf[:4096], b.addr(0), soon())})
	if r := c.wait(t, 1)[0]; r.err != nil {
		t.Fatalf("peer after ClosePeer: %v", r.err)
	}
	c.none(t)
}
