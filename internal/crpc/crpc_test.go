package crpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/crescent-kv/crescent/internal/netx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testSvc is a hand-written service description: Echo, Fail (a status
// with details) and Block (waits for release or its context).
type testSvc struct {
	release chan struct{}
	entered chan struct{}
}

type echoer interface {
	echo(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
}

func (s *testSvc) echo(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	return wrapperspb.String("echo:" + in.Value), nil
}

func handler(name string, f func(s *testSvc, ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)) grpc.MethodHandler {
	// As generated code does: the server's interceptor wraps the call.
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, req any) (any, error) {
			return f(srv.(*testSvc), ctx, req.(*wrapperspb.StringValue))
		}
		if ic == nil {
			return h(ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/crpc.test.Svc/" + name}, h)
	}
}

var testDesc = grpc.ServiceDesc{
	ServiceName: "crpc.test.Svc",
	HandlerType: (*echoer)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Echo", Handler: handler("Echo", (*testSvc).echo)},
		{MethodName: "Fail", Handler: handler("Fail", func(_ *testSvc, _ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			st, _ := status.New(codes.FailedPrecondition, "no: "+in.Value).WithDetails(wrapperspb.Int32(-704))
			return nil, st.Err()
		})},
		{MethodName: "Block", Handler: handler("Block", func(s *testSvc, ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			s.entered <- struct{}{}
			select {
			case <-s.release:
				return wrapperspb.String("released"), nil
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		})},
	},
}

func call(ctx context.Context, cc grpc.ClientConnInterface, method, v string) (string, error) {
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, "/crpc.test.Svc/"+method, wrapperspb.String(v), out)
	return out.Value, err
}

// serveOn starts a crpc server on lis; stop is idempotent.
func serveOn(t testing.TB, lis net.Listener, cfgs ...ServerConfig) (*Server, *testSvc, func()) {
	var cfg ServerConfig
	if len(cfgs) > 0 {
		cfg = cfgs[0]
	}
	t.Helper()
	svc := &testSvc{release: make(chan struct{}), entered: make(chan struct{}, 16)}
	s := NewServer(cfg)
	s.RegisterService(&testDesc, svc)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	stop := sync.OnceFunc(func() {
		s.Stop()
		if err := <-done; !errors.Is(err, ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	})
	t.Cleanup(stop)
	return s, svc, stop
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func dial(t testing.TB, addr string, opts ...Option) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRoundTrip(t *testing.T) {
	lis := listen(t)
	serveOn(t, lis)
	var seen []string
	var mu sync.Mutex
	c := dial(t, lis.Addr().String(), WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		mu.Lock()
		seen = append(seen, method)
		mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
	ctx := tctx(t)
	if got, err := call(ctx, c, "Echo", "hi"); got != "echo:hi" || err != nil {
		t.Fatalf("Echo = %q, %v", got, err)
	}
	// Errors keep their code, message and details.
	_, err := call(ctx, c, "Fail", "x")
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition || st.Message() != "no: x" || len(st.Details()) != 1 {
		t.Fatalf("Fail = %v (details %v)", err, st.Details())
	}
	if d, ok := st.Details()[0].(*wrapperspb.Int32Value); !ok || d.Value != -704 {
		t.Fatalf("detail %v", st.Details()[0])
	}
	if _, err := call(ctx, c, "Nope", ""); status.Code(err) != codes.Unimplemented {
		t.Fatalf("unknown method: %v", err)
	}
	if _, err := c.NewStream(ctx, &grpc.StreamDesc{}, "/x/y"); status.Code(err) != codes.Unimplemented {
		t.Fatalf("NewStream: %v", err)
	}
	// A large message crosses intact.
	big := string(bytes.Repeat([]byte("z"), 3<<20))
	if got, err := call(ctx, c, "Echo", big); err != nil || got != "echo:"+big {
		t.Fatalf("3 MiB echo: %d bytes, %v", len(got), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 4 || seen[0] != "/crpc.test.Svc/Echo" {
		t.Fatalf("interceptor saw %v", seen)
	}
}

// TestConcurrentCalls: many calls in flight on one connection each get
// their own reply.
func TestConcurrentCalls(t *testing.T) {
	lis := listen(t)
	serveOn(t, lis)
	c := dial(t, lis.Addr().String())
	ctx := tctx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				v := fmt.Sprint(g, "/", i)
				if got, err := call(ctx, c, "Echo", v); err != nil || got != "echo:"+v {
					errs <- fmt.Errorf("%s: %q %v", v, got, err)
					return
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

// TestDeadline: the caller's context bounds the wait; the connection
// stays usable, and the server's handler context ends with the
// connection.
func TestDeadline(t *testing.T) {
	lis := listen(t)
	_, svc, _ := serveOn(t, lis)
	c := dial(t, lis.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := call(ctx, c, "Block", ""); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("blocked call: %v", err)
	}
	<-svc.entered
	if got, err := call(tctx(t), c, "Echo", "after"); err != nil || got != "echo:after" {
		t.Fatalf("after a timeout: %q %v", got, err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if _, err := call(cctx, c, "Echo", ""); status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v", err)
	}
	c.Close() // the blocked handler's context ends: Stop does not hang
	if _, err := call(tctx(t), c, "Echo", ""); status.Code(err) != codes.Canceled {
		t.Fatalf("call after Close: %v", err)
	}
}

// TestReconnect: calls fail UNAVAILABLE while the server is gone and work
// again, on a new connection, once it is back on the same address.
func TestReconnect(t *testing.T) {
	lis := listen(t)
	addr := lis.Addr().String()
	_, _, stop := serveOn(t, lis)
	c := dial(t, addr, WithDialTimeout(time.Second))
	ctx := tctx(t)
	if _, err := call(ctx, c, "Echo", "1"); err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := call(ctx, c, "Echo", "2"); status.Code(err) != codes.Unavailable {
		t.Fatalf("server gone: %v", err)
	}
	lis2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	serveOn(t, lis2)
	if got, err := call(ctx, c, "Echo", "3"); err != nil || got != "echo:3" {
		t.Fatalf("after restart: %q %v", got, err)
	}
}

// TestGracefulStop: a call in progress answers; new calls are refused;
// Serve returns.
func TestGracefulStop(t *testing.T) {
	lis := listen(t)
	s, svc, _ := serveOn(t, lis)
	c := dial(t, lis.Addr().String())
	ctx := tctx(t)
	res := make(chan error, 1)
	go func() {
		got, err := call(ctx, c, "Block", "")
		if err == nil && got != "released" {
			err = fmt.Errorf("got %q", got)
		}
		res <- err
	}()
	<-svc.entered
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	// New calls on the open connection are refused while draining.
	for {
		_, err := call(ctx, c, "Echo", "")
		if status.Code(err) == codes.Unavailable {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a call in progress")
	default:
	}
	close(svc.release)
	if err := <-res; err != nil {
		t.Fatalf("call in progress: %v", err)
	}
	<-stopped
}

// TestSplit: one port serves gRPC and crpc; Dial to a gRPC-only server is
// ErrNotCRPC.
func TestSplit(t *testing.T) {
	lis := listen(t)
	cl, gl := Split(lis, netx.Config{})
	serveOn(t, cl)
	g := grpc.NewServer()
	g.RegisterService(&testDesc, &testSvc{})
	gdone := make(chan struct{})
	go func() { g.Serve(gl); close(gdone) }()
	defer func() { g.Stop(); <-gdone }()
	ctx := tctx(t)
	addr := lis.Addr().String()
	c := dial(t, addr)
	if got, err := call(ctx, c, "Echo", "c"); got != "echo:c" || err != nil {
		t.Fatalf("crpc: %q %v", got, err)
	}
	gc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	if got, err := call(ctx, gc, "Echo", "g"); got != "echo:g" || err != nil {
		t.Fatalf("grpc: %q %v", got, err)
	}
	// A gRPC-only server.
	lis2 := listen(t)
	g2 := grpc.NewServer()
	g2done := make(chan struct{})
	go func() { g2.Serve(lis2); close(g2done) }()
	defer func() { g2.Stop(); <-g2done }()
	if _, err := Dial(ctx, lis2.Addr().String()); !errors.Is(err, ErrNotCRPC) {
		t.Fatalf("Dial to gRPC: %v", err)
	}
	// A silent connection does not block the others.
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if got, err := call(ctx, dial(t, addr), "Echo", "x"); got != "echo:x" || err != nil {
		t.Fatalf("with a silent peer: %q %v", got, err)
	}
}

// TestBadFrames: a malformed frame closes that connection only; a wrong
// version is refused with the server's.
func TestBadFrames(t *testing.T) {
	lis := listen(t)
	serveOn(t, lis)
	addr := lis.Addr().String()
	good := dial(t, addr)
	hdr := func(n uint32, id uint32, kind byte) []byte {
		b := make([]byte, headerLen)
		binary.LittleEndian.PutUint32(b, n)
		binary.LittleEndian.PutUint32(b[4:], id)
		b[8] = kind
		return b
	}
	for name, payload := range map[string][]byte{
		"oversize":        hdr(DefaultMaxFrame+1, 1, kindRequest),
		"bad kind":        hdr(0, 1, 9),
		"reply to server": hdr(0, 1, kindReply),
		"short request":   append(hdr(1, 1, kindRequest), 0),
		"no method":       append(hdr(9, 1, kindRequest), make([]byte, 9)...),
		"short method":    append(hdr(10, 1, kindRequest), 0, 0, 0, 0, 0, 0, 0, 0, 5, 'x'),
		"ping with body":  append(hdr(1, 1, kindPing), 0),
	} {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		raw.Write(append(preface(), payload...))
		raw.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, _ := io.ReadAll(raw) // the server's preface, then EOF
		raw.Close()
		if !bytes.Equal(got, preface()) {
			t.Errorf("%s: read %q, want the preface then EOF", name, got)
		}
	}
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := preface()
	p[4] = 99
	raw.Write(p)
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(raw)
	raw.Close()
	if err := checkPreface(got); err != nil || len(got) != prefaceLen {
		t.Fatalf("wrong version answered %q", got)
	}
	if got, err := call(tctx(t), good, "Echo", "still"); got != "echo:still" || err != nil {
		t.Fatalf("other connection: %q %v", got, err)
	}
}

// FuzzReader: any byte stream decodes to frames within bounds or an
// error, never a panic.
func FuzzReader(f *testing.F) {
	req := make([]byte, headerLen+requestFixed, 64)
	req[headerLen+8] = 4
	req = append(req, "/a/b"...)
	putHeader(req, 7, kindRequest, DefaultMaxFrame)
	f.Add(req)
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		rd := newReader(bytes.NewReader(b), DefaultMaxFrame)
		// What a frame reserves (and allocates) follows the bytes that
		// arrived, not the length its header declares.
		reserved := 0
		rd.onHeader = func(bool) { reserved = 0 }
		rd.reserve = func(n int) error {
			reserved += n
			if reserved > max(growStep, 2*len(b)) {
				t.Fatalf("reserved %d bytes for a %d-byte input", reserved, len(b))
			}
			return nil
		}
		for {
			fr, err := rd.next()
			if err != nil {
				return
			}
			if len(fr.body) > DefaultMaxFrame || fr.kind < kindRequest || fr.kind > kindPong {
				t.Fatalf("frame out of bounds: kind %d, %d bytes", fr.kind, len(fr.body))
			}
			if fr.kind == kindRequest {
				if _, m, _, err := parseRequest(fr.body); err == nil && (len(m) == 0 || len(m) > 255) {
					t.Fatalf("method %q", m)
				}
			}
		}
	})
}

// BenchmarkUnary compares one small call over crpc with the same call
// over gRPC (the baseline), on loopback, sequential and 8 in parallel.
func BenchmarkUnary(b *testing.B) {
	lis := listen(b)
	cl, gl := Split(lis, netx.Config{})
	serveOn(b, cl)
	g := grpc.NewServer()
	g.RegisterService(&testDesc, &testSvc{})
	gdone := make(chan struct{})
	go func() { g.Serve(gl); close(gdone) }()
	b.Cleanup(func() { g.Stop(); <-gdone })
	addr := lis.Addr().String()
	gc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { gc.Close() })
	for _, c := range []struct {
		name string
		cc   grpc.ClientConnInterface
	}{{"crpc", dial(b, addr)}, {"grpc", gc}} {
		ctx := context.Background()
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := call(ctx, c.cc, "Echo", "0123456789abcdef"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"-parallel8", func(b *testing.B) {
			b.SetParallelism(4) // 8 goroutines on 2 CPUs
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := call(ctx, c.cc, "Echo", "0123456789abcdef"); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
