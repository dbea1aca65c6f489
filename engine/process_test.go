package engine_test

import (
	"bufio"
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/testutil"
)

const childEnv = "CRESCENT_ENGINE_TEST_CHILD"

// runChild is a target engine in its own process. It prints
// "SEGMENT <name> <buffer addr>" and answers "sum <off> <len>" with the
// CRC32 of that part of its buffer, until stdin closes.
func runChild() {
	proto := os.Getenv(childEnv)
	p, err := mempool.New(mempool.Options{Size: 64 << 20, SlabSize: 1 << 20})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	buf, _ := p.Alloc(64 << 20)
	e, err := engine.New(engine.Config{LocalServerName: "127.0.0.1", Protocols: []string{proto}})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	if err := e.RegisterMemory(buf, ""); err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Printf("SEGMENT %s %d\n", e.Name(), transport.AddrOf(buf))
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var off, n int
		var seg string
		var addr uint64
		if _, err := fmt.Sscanf(sc.Text(), "sum %d %d", &off, &n); err == nil {
			fmt.Printf("%d\n", crc32.ChecksumIEEE(buf[off:off+n]))
		} else if _, err := fmt.Sscanf(sc.Text(), "write %s %d %d", &seg, &addr, &n); err == nil {
			fmt.Println(childWrite(e, buf[:n], seg, addr))
		}
	}
	e.Close()
	p.Close()
	os.Exit(0)
}

// childWrite writes local to addr of segment seg; over shm this maps
// the segment's buffer into the child.
func childWrite(e *engine.Engine, local []byte, seg string, addr uint64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := e.OpenSegment(ctx, seg)
	if err != nil {
		return "ERR " + err.Error()
	}
	b, _ := e.AllocateBatch(1)
	defer e.FreeBatch(b)
	if err := e.Submit(b, []engine.Request{{Op: engine.Write, Local: local, Target: id, TargetAddr: addr}}); err != nil {
		return "ERR " + err.Error()
	}
	if _, err := e.Wait(ctx, b); err != nil {
		return "ERR " + err.Error()
	}
	return "ok"
}

// stop sends SIGSTOP and waits until the kernel reports the child
// stopped (signals are delivered asynchronously).
func (c *child) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGSTOP))
	path := fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid)
	eventually(t, 10*time.Second, func() bool {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		// "pid (comm) S ...": the state follows the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		return i > 0 && i+2 < len(b) && b[i+2] == 'T'
	})
}

type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	name string
	base uint64
}

func startChild(t *testing.T, proto string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+proto)
	in, _ := cmd.StdinPipe()
	outPipe, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewReader(outPipe)}
	t.Cleanup(func() {
		c.in.Close()
		done := make(chan struct{})
		go func() { c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			c.cmd.Process.Kill()
			<-done
		}
	})
	line, err := c.out.ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if _, err := fmt.Sscanf(line, "SEGMENT %s %d", &c.name, &c.base); err != nil {
		t.Fatalf("child said %q", line)
	}
	return c
}

func (c *child) sum(t *testing.T, off, n int) uint32 {
	t.Helper()
	fmt.Fprintf(c.in, "sum %d %d\n", off, n)
	line, err := c.out.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	var v uint32
	fmt.Sscanf(strings.TrimSpace(line), "%d", &v)
	return v
}

func TestTwoProcesses(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			c := startChild(t, proto)
			a := newNode(t, 8<<20, engine.Config{Protocols: []string{proto}})
			seg, err := a.e.OpenSegment(context.Background(), c.name)
			if err != nil {
				t.Fatal(err)
			}
			defer a.e.CloseSegment(seg)
			testutil.Fill(a.buf[:4<<20], 11)
			id, _ := a.e.AllocateBatch(4)
			var reqs []engine.Request
			for i := 0; i < 4; i++ {
				reqs = append(reqs, engine.Request{Op: engine.Write, Local: a.buf[i<<20 : (i+1)<<20], Target: seg, TargetAddr: c.base + uint64(i)<<21})
			}
			a.e.Submit(id, reqs)
			wait(t, a.e, id)
			a.e.FreeBatch(id)
			for i := range reqs {
				if got, want := c.sum(t, i<<21, 1<<20), crc32.ChecksumIEEE(reqs[i].Local); got != want {
					t.Fatalf("block %d: child has crc %08x, want %08x", i, got, want)
				}
			}
			// And back.
			back := a.buf[4<<20 : 8<<20]
			id, _ = a.e.AllocateBatch(4)
			for i := range reqs {
				reqs[i] = engine.Request{Op: engine.Read, Local: back[i<<20 : (i+1)<<20], Target: seg, TargetAddr: c.base + uint64(i)<<21}
			}
			a.e.Submit(id, reqs)
			wait(t, a.e, id)
			a.e.FreeBatch(id)
			for i := range reqs {
				if crc32.ChecksumIEEE(back[i<<20:(i+1)<<20]) != crc32.ChecksumIEEE(a.buf[i<<20:(i+1)<<20]) {
					t.Fatalf("read back block %d differs", i)
				}
			}
		})
	}
}

// TestPeerKilledMidBatch kills the target while a batch runs: every
// request must end (none stays PENDING), well before the transfer
// timeout, and later submissions must fail cleanly. The first half of
// the batch completes; the target is then stopped (SIGSTOP), so the
// second half cannot finish before the SIGKILL lands.
func TestPeerKilledMidBatch(t *testing.T) {
	c := startChild(t, "tcp")
	a := newNode(t, 64<<20, engine.Config{Protocols: []string{"tcp"}, TransferTimeout: 60 * time.Second})
	seg, err := a.e.OpenSegment(context.Background(), c.name)
	require.NoError(t, err)
	defer a.e.CloseSegment(seg)
	const n, block = 2048, 32 << 10
	id, _ := a.e.AllocateBatch(n)
	reqs := make([]engine.Request, n)
	for i := range reqs {
		off := (i * block) % (64<<20 - block)
		reqs[i] = engine.Request{Op: engine.Write, Local: a.buf[off : off+block], Target: seg, TargetAddr: c.base + uint64(off)}
	}
	require.NoError(t, a.e.Submit(id, reqs[:n/2]))
	wait(t, a.e, id)
	c.stop(t)
	require.NoError(t, a.e.Submit(id, reqs[n/2:]))
	require.NoError(t, c.cmd.Process.Kill())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := a.e.Wait(ctx, id)
	require.NoError(t, ctx.Err(), "batch still pending 30s after the peer died: %+v", st)
	require.Zero(t, st.Pending, "unfinished requests: %+v", st)
	require.Equal(t, n/2, st.Completed, "%+v", st)
	require.Equal(t, n/2, st.Failed, "%+v", st)
	require.Error(t, err)
	require.ErrorIs(t, st.Err, transport.ErrPeerGone)
	eventually(t, 10*time.Second, func() bool { return a.e.FreeBatch(id) == nil })

	// Later requests fail fast rather than hang.
	id, _ = a.e.AllocateBatch(1)
	if err := a.e.Submit(id, reqs[:1]); err == nil {
		if _, err := a.e.Wait(ctx, id); err == nil {
			t.Fatal("write to a dead peer completed")
		}
	}
	eventually(t, 10*time.Second, func() bool { return a.e.FreeBatch(id) == nil })
}

// stallingTarget answers the handshake with a descriptor whose data port
// accepts connections and never replies.
type stallingTarget struct {
	name  string
	base  uint64
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newStallingTarget(t *testing.T) *stallingTarget {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &stallingTarget{ln: ln, base: 0x10000000}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			go io.Copy(io.Discard, c)
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	var name atomic.Value // set once the server knows its port
	srv, err := metadata.NewServer(metadata.ServerConfig{Addr: "127.0.0.1:0", Handlers: metadata.Handlers{
		Metadata: func() *metadata.SegmentDesc {
			return &metadata.SegmentDesc{Name: name.Load().(string), Protocol: "tcp", TCPDataPort: port, TCPProtoVersion: 2,
				Buffers: []metadata.Buffer{{Name: "cpu:0", Addr: s.base, Length: 1 << 20}}}
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	name.Store(srv.Addr())
	s.name = srv.Addr()
	t.Cleanup(func() {
		srv.Close()
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	})
	return s
}

// TestQuarantineStoppedPeer: a same-host peer maps our buffer and is
// stopped (SIGSTOP), so it cannot confirm the revoke. Unregistering must
// not report the memory free: it stays quarantined (hidden, not
// registrable again) until the peer is killed, then it is released.
func TestQuarantineStoppedPeer(t *testing.T) {
	c := startChild(t, "shm")
	cfg := engine.Config{Protocols: []string{"shm"}}
	cfg.Shm.RevokeTimeout = 300 * time.Millisecond
	a := newNode(t, 4<<20, cfg)
	fmt.Fprintf(c.in, "write %s %d %d\n", a.e.Name(), a.addr(0), 4096)
	line, err := c.out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ok", strings.TrimSpace(line), "the child mapped and wrote our buffer")
	c.stop(t)

	err = a.e.UnregisterMemory(context.Background(), a.buf)
	require.ErrorIs(t, err, engine.ErrQuarantined, "an unconfirmed revoke reported as success")
	var q *engine.QuarantineError
	require.ErrorAs(t, err, &q)
	select {
	case <-q.Released:
		t.Fatal("released while the stopped peer still maps the buffer")
	default:
	}
	require.Len(t, a.e.Quarantined(), 1)
	require.ErrorIs(t, a.e.UnregisterMemory(context.Background(), a.buf), engine.ErrQuarantined, "a retry while quarantined")
	require.ErrorIs(t, a.e.RegisterMemory(a.buf, "cpu:0"), engine.ErrAlreadyRegistered, "quarantined memory registered again")
	for _, b := range a.e.LocalDesc().Buffers {
		require.NotEqual(t, a.addr(0), b.Addr, "quarantined buffer still published")
	}

	require.NoError(t, c.cmd.Process.Kill())
	select {
	case <-q.Released:
	case <-time.After(20 * time.Second):
		t.Fatal("not released after the peer died")
	}
	require.NoError(t, a.e.UnregisterMemory(context.Background(), a.buf))
	require.Empty(t, a.e.Quarantined())
	require.NoError(t, a.e.RegisterMemory(a.buf, "cpu:0"), "released memory can be registered again")
}
