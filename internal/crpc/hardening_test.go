package crpc

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/crescent-kv/crescent/internal/netx"
)

// rawConn is a hand-driven crpc client: the preface exchanged, frames
// written and read by the test.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = c.Write(preface())
	require.NoError(t, err)
	p := make([]byte, prefaceLen)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(c, p)
	require.NoError(t, err)
	require.NoError(t, checkPreface(p))
	c.SetReadDeadline(time.Time{})
	return c
}

func request(id uint32, method, v string, timeout time.Duration) []byte {
	msg, _ := proto.Marshal(wrapperspb.String(v))
	b := make([]byte, headerLen+requestFixed, headerLen+requestFixed+len(method)+len(msg))
	binary.LittleEndian.PutUint64(b[headerLen:], uint64(timeout/time.Microsecond))
	b[headerLen+8] = byte(len(method))
	b = append(b, method...)
	b = append(b, msg...)
	putHeader(b, id, kindRequest, maxFrameLimit)
	return b
}

// closedByPeer waits (bounded) for c to be closed by the other side.
func closedByPeer(t *testing.T, c net.Conn, within time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %v", within)
	}
}

// TestPartialFrameDropped: a frame whose header declares 200 MiB but whose
// body stops after 1 MiB is dropped at the frame deadline (the idle
// timeout is an hour), and the server never allocated anything near the
// declared size; a header over MaxFrame closes at once.
func TestPartialFrameDropped(t *testing.T) {
	lis := listen(t)
	serveOn(t, lis, ServerConfig{MaxFrame: 256 << 20, FrameTimeout: 200 * time.Millisecond, IdleTimeout: time.Hour})
	addr := lis.Addr().String()

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c := rawConn(t, addr)
	hdr := make([]byte, headerLen)
	binary.LittleEndian.PutUint32(hdr, 200<<20)
	hdr[8] = kindRequest
	_, err := c.Write(append(hdr, make([]byte, 1<<20)...))
	require.NoError(t, err)
	closedByPeer(t, c, 10*time.Second)
	runtime.ReadMemStats(&after)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(32<<20), "bytes allocated while 1 MiB of a 200 MiB frame arrived")

	c = rawConn(t, addr)
	binary.LittleEndian.PutUint32(hdr, 256<<20+1)
	_, err = c.Write(hdr)
	require.NoError(t, err)
	closedByPeer(t, c, 10*time.Second)
}

// TestMemoryBudget: connections that each send 1 MiB of a 4 MiB frame
// and stop hold at most MaxBufferedBytes of server memory together: the
// readers beyond it wait for the budget (and are not allocating) rather
// than buffer; once the stalled connections go, calls run again.
func TestMemoryBudget(t *testing.T) {
	const budget, stalled = 4 << 20, 8
	lis := listen(t)
	s, _, _ := serveOn(t, lis, ServerConfig{MaxFrame: 4 << 20, MaxBufferedBytes: budget, FrameTimeout: time.Hour, IdleTimeout: time.Hour})
	addr := lis.Addr().String()
	hdr := make([]byte, headerLen)
	binary.LittleEndian.PutUint32(hdr, 4<<20)
	hdr[8] = kindRequest
	part := append(hdr, make([]byte, 1<<20)...)
	var conns []net.Conn
	for range stalled {
		c := rawConn(t, addr)
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, err := c.Write(part)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	require.Eventually(t, func() bool {
		// At most four can have their 1 MiB; the others wait.
		used, _, waiting := s.mem.State()
		return used <= budget && waiting >= stalled-budget/(1<<20)
	}, 30*time.Second, time.Millisecond, "the other readers wait for the budget")
	_, peak, _ := s.mem.State()
	assert.LessOrEqual(t, peak, int64(budget))
	for _, c := range conns {
		c.Close()
	}
	got, err := call(tctx(t), dial(t, addr), "Echo", "after")
	require.NoError(t, err)
	assert.Equal(t, "echo:after", got)
	require.Eventually(t, func() bool { used, _, _ := s.mem.State(); return used == 0 }, 30*time.Second, time.Millisecond)
}

// TestIdleTimeout: a connection that says nothing after its preface, or
// stops halfway through a header, is closed at the idle timeout.
func TestIdleTimeout(t *testing.T) {
	lis := listen(t)
	serveOn(t, lis, ServerConfig{IdleTimeout: 200 * time.Millisecond, FrameTimeout: time.Hour})
	closedByPeer(t, rawConn(t, lis.Addr().String()), 10*time.Second)
	c := rawConn(t, lis.Addr().String())
	_, err := c.Write([]byte{1, 0})
	require.NoError(t, err)
	closedByPeer(t, c, 10*time.Second)
}

// TestDefaultMaxFrame: the default bound is DefaultMaxFrame, not the
// header's 4 GiB; a client's oversize request fails before it is sent.
func TestDefaultMaxFrame(t *testing.T) {
	lis := listen(t)
	serveOn(t, lis)
	c := rawConn(t, lis.Addr().String())
	hdr := make([]byte, headerLen)
	binary.LittleEndian.PutUint32(hdr, 64<<20+1) // the documented default, not the header's 4 GiB
	hdr[8] = kindRequest
	_, err := c.Write(hdr)
	require.NoError(t, err)
	closedByPeer(t, c, 10*time.Second)

	cc := dial(t, lis.Addr().String(), WithMaxFrame(1<<10))
	_, err = call(tctx(t), cc, "Echo", strings.Repeat("x", 2<<10))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	got, err := call(tctx(t), cc, "Echo", "small")
	require.NoError(t, err)
	assert.Equal(t, "echo:small", got)
}

// countSvc counts concurrent handler invocations per connection tag (the
// request's value) and in all.
type countSvc struct {
	mu      sync.Mutex
	cur     map[string]int
	max     map[string]int
	total   int
	maxAll  int
	entered chan struct{}
	release chan struct{}
}

var countDesc = grpc.ServiceDesc{
	ServiceName: "crpc.test.Count",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Hold", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		s := srv.(*countSvc)
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.cur[in.Value]++
		s.total++
		s.max[in.Value] = max(s.max[in.Value], s.cur[in.Value])
		s.maxAll = max(s.maxAll, s.total)
		s.mu.Unlock()
		s.entered <- struct{}{}
		<-s.release
		s.mu.Lock()
		s.cur[in.Value]--
		s.total--
		s.mu.Unlock()
		return wrapperspb.String(in.Value), nil
	}}},
}

// TestInFlightBound: connections pipelining requests without reading
// replies never have more than MaxCallsPerConn handlers running each, nor
// more than MaxCalls in all; at the per-connection bound other
// connections are still served; every request is answered once slots
// free.
func TestInFlightBound(t *testing.T) {
	for _, tc := range []struct {
		name          string
		perConn, all  int
		otherAnswered bool
	}{
		{"per connection", 8, 1000, true},
		{"server-wide", 8, 12, false},
	} {
		t.Run(tc.name, func(t *testing.T) { testInFlightBound(t, tc.perConn, tc.all, tc.otherAnswered) })
	}
}

func testInFlightBound(t *testing.T, perConn, all int, otherAnswered bool) {
	const sent = 60
	lis := listen(t)
	svc := &countSvc{cur: map[string]int{}, max: map[string]int{}, entered: make(chan struct{}, 2*sent), release: make(chan struct{})}
	s := NewServer(ServerConfig{MaxCallsPerConn: perConn, MaxCalls: all})
	s.RegisterService(&countDesc, svc)
	s.RegisterService(&testDesc, &testSvc{})
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	release := sync.OnceFunc(func() { close(svc.release) })
	defer func() {
		release()
		s.Stop()
		<-done
	}()
	addr := lis.Addr().String()
	conns := map[string]net.Conn{"a": rawConn(t, addr), "b": rawConn(t, addr)}
	for tag, c := range conns {
		var buf []byte
		for i := range sent {
			buf = append(buf, request(uint32(i+1), "/crpc.test.Count/Hold", tag, 0)...)
		}
		_, err := c.Write(buf)
		require.NoError(t, err)
	}
	want := min(2*perConn, all)
	for range want {
		<-svc.entered
	}
	// A call on another connection: answered at the per-connection bound,
	// held for a slot at the server-wide one. Either way it gives the
	// pipelined requests time to start beyond the bounds, if they could.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	if otherAnswered {
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	}
	got, err := call(ctx, dial(t, addr), "Echo", "x")
	cancel()
	if otherAnswered {
		require.NoError(t, err)
		assert.Equal(t, "echo:x", got)
	} else {
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	}
	svc.mu.Lock()
	assert.Equal(t, want, svc.total, "handlers running")
	svc.mu.Unlock()
	release()
	for tag, c := range conns {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		rd := newReader(c, DefaultMaxFrame)
		for range sent {
			f, err := rd.next()
			require.NoError(t, err, tag)
			require.Equal(t, byte(kindReply), f.kind)
		}
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	assert.LessOrEqual(t, svc.max["a"], perConn)
	assert.LessOrEqual(t, svc.max["b"], perConn)
	assert.LessOrEqual(t, svc.maxAll, all)
}

// silentServer completes the preface on each connection, then reads its
// frames (reported on kinds, when read is set) and never answers.
type silentServer struct {
	lis      net.Listener
	accepted chan net.Conn
	kinds    chan byte
	wg       sync.WaitGroup
}

func newSilentServer(t *testing.T, read bool) *silentServer {
	ss := &silentServer{lis: listen(t), accepted: make(chan net.Conn, 16), kinds: make(chan byte, 1024)}
	ss.wg.Add(1)
	go func() {
		defer ss.wg.Done()
		for {
			c, err := ss.lis.Accept()
			if err != nil {
				return
			}
			p := make([]byte, prefaceLen)
			io.ReadFull(c, p)
			c.Write(preface())
			ss.accepted <- c
			if read {
				ss.wg.Add(1)
				go func() {
					defer ss.wg.Done()
					rd := newReader(c, maxFrameLimit)
					for {
						f, err := rd.next()
						if err != nil {
							return
						}
						select {
						case ss.kinds <- f.kind:
						default:
						}
					}
				}()
			}
		}
	}()
	t.Cleanup(func() {
		ss.lis.Close()
		for len(ss.accepted) > 0 {
			(<-ss.accepted).Close()
		}
		ss.wg.Wait()
	})
	return ss
}

// waitKinds waits for frames of each kind to reach the silent server, in
// any order.
func (ss *silentServer) waitKinds(t *testing.T, kinds ...byte) {
	t.Helper()
	want := map[byte]bool{}
	for _, k := range kinds {
		want[k] = true
	}
	timeout := time.After(30 * time.Second)
	for len(want) > 0 {
		select {
		case got := <-ss.kinds:
			delete(want, got)
		case <-timeout:
			t.Fatalf("no frame of kinds %v", want)
		}
	}
}

func current(c *Conn) *clientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// TestWriteHonoursDeadline: against a server that stops reading, a call
// whose request cannot be written returns DEADLINE_EXCEEDED at its
// deadline, and so does a call queued behind its write.
func TestWriteHonoursDeadline(t *testing.T) {
	ss := newSilentServer(t, false)
	c := dial(t, ss.lis.Addr().String())
	cc := current(c)
	big := strings.Repeat("z", 48<<20) // more than the socket buffers hold
	errs := make(chan error, 2)
	invoke := func(v string, d time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := call(ctx, c, "Echo", v)
		errs <- err
	}
	go invoke(big, 3*time.Second)
	require.Eventually(t, func() bool { return len(cc.wsem) == 1 }, 30*time.Second, time.Millisecond, "the big write started")
	go invoke("small", 200*time.Millisecond) // behind it
	for range 2 {
		select {
		case err := <-errs:
			assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		case <-time.After(20 * time.Second):
			t.Fatal("a call blocked in its write past its deadline")
		}
	}
}

// TestServerWriteTimeout: a client that stops reading its replies loses
// its connection at the server's write timeout instead of holding a
// handler (and its slots) forever.
func TestServerWriteTimeout(t *testing.T) {
	lis := listen(t)
	s, _, _ := serveOn(t, lis, ServerConfig{WriteTimeout: 200 * time.Millisecond, IdleTimeout: time.Hour})
	c := rawConn(t, lis.Addr().String())
	c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	_, err := c.Write(request(1, "/crpc.test.Svc/Echo", strings.Repeat("r", 32<<20), 0)) // its reply fills the socket buffers
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns) == 0
	}, 30*time.Second, time.Millisecond, "the connection is still served")
}

// blockDesc's Wait reports how its handler's context ended and whether
// it had a deadline.
type waitSvc struct {
	entered chan struct{}
	ended   chan error
	dl      chan time.Duration
}

var waitDesc = grpc.ServiceDesc{
	ServiceName: "crpc.test.Wait",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Wait", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		s := srv.(*waitSvc)
		dl, ok := ctx.Deadline()
		if ok {
			s.dl <- time.Until(dl)
		} else {
			s.dl <- 0
		}
		s.entered <- struct{}{}
		<-ctx.Done()
		s.ended <- ctx.Err()
		return nil, status.FromContextError(ctx.Err()).Err()
	}}},
}

// TestCancelReachesHandler: cancelling a call ends its handler's context
// (a cancel frame), and the caller's deadline is the handler's.
func TestCancelReachesHandler(t *testing.T) {
	lis := listen(t)
	ws := &waitSvc{entered: make(chan struct{}, 4), ended: make(chan error, 4), dl: make(chan time.Duration, 4)}
	s := NewServer(ServerConfig{})
	s.RegisterService(&waitDesc, ws)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	defer func() { s.Stop(); <-done }()
	c := dial(t, lis.Addr().String())
	invoke := func(ctx context.Context) chan error {
		res := make(chan error, 1)
		go func() {
			res <- c.Invoke(ctx, "/crpc.test.Wait/Wait", wrapperspb.String(""), new(wrapperspb.StringValue))
		}()
		return res
	}

	ctx, cancel := context.WithCancel(context.Background())
	res := invoke(ctx)
	<-ws.entered
	assert.Equal(t, time.Duration(0), <-ws.dl, "a call without a deadline")
	cancel()
	assert.Equal(t, codes.Canceled, status.Code(<-res))
	select {
	case err := <-ws.ended:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(20 * time.Second):
		t.Fatal("the handler's context did not end when the call was cancelled")
	}

	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res = invoke(ctx)
	<-ws.entered
	d := <-ws.dl
	assert.Greater(t, d, time.Duration(0))
	assert.LessOrEqual(t, d, 20*time.Second)
	cancel()
	<-res
	<-ws.ended
}

// TestPingDetectsSilentPeer: an idle connection to a server that stops
// answering is pinged and broken when no pong comes; so is one whose call
// timed out with nothing received; the next call dials again.
func TestPingDetectsSilentPeer(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		ss := newSilentServer(t, true)
		c := dial(t, ss.lis.Addr().String(), WithPing(20*time.Millisecond, 50*time.Millisecond))
		cc := current(c)
		ss.waitKinds(t, kindPing)
		select {
		case <-cc.done:
		case <-time.After(20 * time.Second):
			t.Fatal("no pong and the connection is still up")
		}
		assert.Equal(t, codes.Unavailable, status.Code(cc.err))
	})
	t.Run("after a timeout", func(t *testing.T) {
		ss := newSilentServer(t, true)
		c := dial(t, ss.lis.Addr().String(), WithPing(time.Hour, 50*time.Millisecond))
		cc := current(c)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := call(ctx, c, "Echo", "")
		cancel()
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
		ss.waitKinds(t, kindRequest, kindCancel, kindPing)
		<-cc.done
		ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
		call(ctx, c, "Echo", "")
		cancel()
		assert.NotSame(t, cc, current(c), "dialled again")
		assert.Len(t, ss.accepted, 2)
	})
}

// TestPingKeepsAlive: a pinging client outlives the server's idle
// timeout on one connection.
func TestPingKeepsAlive(t *testing.T) {
	lis := listen(t)
	serveOn(t, lis, ServerConfig{IdleTimeout: 500 * time.Millisecond})
	c := dial(t, lis.Addr().String(), WithPing(10*time.Millisecond, 10*time.Second))
	cc := current(c)
	require.Eventually(t, func() bool { return cc.pongs.Load() >= 100 }, 60*time.Second, 10*time.Millisecond)
	got, err := call(tctx(t), c, "Echo", "alive")
	require.NoError(t, err)
	assert.Equal(t, "echo:alive", got)
	assert.Same(t, cc, current(c))
	assert.False(t, cc.broken())
}

// TestServerInterceptor: the interceptor sees every call, its method and
// outcome, as a grpc.Server's does.
func TestServerInterceptor(t *testing.T) {
	type seen struct {
		method string
		code   codes.Code
	}
	var mu sync.Mutex
	var got []seen
	ic := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		mu.Lock()
		got = append(got, seen{info.FullMethod, status.Code(err)})
		mu.Unlock()
		return resp, err
	}
	lis := listen(t)
	serveOn(t, lis, ServerConfig{Interceptor: ic})
	c := dial(t, lis.Addr().String())
	ctx := tctx(t)
	_, err := call(ctx, c, "Echo", "a")
	require.NoError(t, err)
	_, err = call(ctx, c, "Fail", "b")
	require.Error(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []seen{{"/crpc.test.Svc/Echo", codes.OK}, {"/crpc.test.Svc/Fail", codes.FailedPrecondition}}, got)
}

// TestSplitFDExhaustion: Split serving crpc and gRPC on one port keeps
// serving through EMFILE on accept: once fds are back, both answer.
func TestSplitFDExhaustion(t *testing.T) {
	lis := listen(t)
	cl, gl := Split(lis, netx.Config{})
	_, _, stop := serveOn(t, cl)
	g := grpc.NewServer()
	g.RegisterService(&testDesc, &testSvc{})
	gdone := make(chan error, 1)
	go func() { gdone <- g.Serve(gl) }()
	defer func() { g.Stop(); <-gdone; stop() }()
	addr := lis.Addr().String()

	finish := netx.StarveWithPeer(t, addr) // a peer left in the backlog
	time.Sleep(50 * time.Millisecond)      // several failed accepts
	finish()
	select {
	case err := <-gdone:
		t.Fatalf("gRPC Serve ended: %v", err)
	default:
	}

	got, err := call(tctx(t), dial(t, addr), "Echo", "c")
	require.NoError(t, err)
	assert.Equal(t, "echo:c", got)
	gc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer gc.Close()
	got, err = call(tctx(t), gc, "Echo", "g")
	require.NoError(t, err)
	assert.Equal(t, "echo:g", got)
}
