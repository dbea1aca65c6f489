package drpcx

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/internal/testsvc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type svc struct{}

type echoer interface{}

func handler(name string, f func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, req any) (any, error) { return f(ctx, req.(*wrapperspb.StringValue)) }
		if ic == nil {
			return h(ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/drpcx.test.Svc/" + name}, h)
	}
}

var testDesc = grpc.ServiceDesc{
	ServiceName: "drpcx.test.Svc",
	HandlerType: (*echoer)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Echo", Handler: handler("Echo", func(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			return wrapperspb.String("echo:" + in.Value), nil
		})},
		{MethodName: "Fail", Handler: handler("Fail", func(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			st, _ := status.New(codes.FailedPrecondition, "no: "+in.Value).WithDetails(wrapperspb.Int32(-704))
			return nil, st.Err()
		})},
		{MethodName: "Slow", Handler: handler("Slow", func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			<-ctx.Done()
			return nil, status.FromContextError(ctx.Err()).Err()
		})},
	},
}

func call(ctx context.Context, cc grpc.ClientConnInterface, method, v string) (string, error) {
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, "/drpcx.test.Svc/"+method, wrapperspb.String(v), out)
	return out.Value, err
}

// start serves desc over drpc on a loopback port, counting calls in the
// interceptor.
func start(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	s := NewServer(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		n.Add(1)
		return h(ctx, req)
	}, netx.Config{})
	require.NoError(t, s.Register(&testDesc, &svc{}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return lis.Addr().String(), &n
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestRoundTrip: replies, statuses with their details, unknown methods,
// the interceptor, a message beyond drpc's 4 MiB default.
func TestRoundTrip(t *testing.T) {
	addr, calls := start(t)
	ctx := tctx(t)
	c, err := Dial(ctx, addr, nil)
	require.NoError(t, err)
	defer c.Close()
	got, err := call(ctx, c, "Echo", "hi")
	require.NoError(t, err)
	require.Equal(t, "echo:hi", got)

	_, err = call(ctx, c, "Fail", "x")
	st := status.Convert(err)
	require.Equal(t, codes.FailedPrecondition, st.Code())
	require.Equal(t, "no: x", st.Message())
	require.Len(t, st.Details(), 1)
	require.EqualValues(t, -704, st.Details()[0].(*wrapperspb.Int32Value).Value)

	_, err = call(ctx, c, "Nope", "")
	require.Error(t, err)

	big := strings.Repeat("b", 6<<20)
	got, err = call(ctx, c, "Echo", big)
	require.NoError(t, err)
	require.Equal(t, "echo:"+big, got)
	require.EqualValues(t, 3, calls.Load(), "the unknown method never reaches a handler")
}

// TestConcurrent: calls in flight each get a connection of the pool.
func TestConcurrent(t *testing.T) {
	addr, calls := start(t)
	ctx := tctx(t)
	c, err := Dial(ctx, addr, nil)
	require.NoError(t, err)
	defer c.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				v := string(rune('a'+i)) + string(rune('a'+j))
				got, err := call(ctx, c, "Echo", v)
				if err == nil && got != "echo:"+v {
					err = errors.New("wrong reply " + got)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 16*20, calls.Load())
}

// TestDeadline: a caller's deadline ends its call with
// DEADLINE_EXCEEDED, and the pool still serves afterwards.
func TestDeadline(t *testing.T) {
	addr, _ := start(t)
	ctx := tctx(t)
	c, err := Dial(ctx, addr, nil)
	require.NoError(t, err)
	defer c.Close()
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = call(sctx, c, "Slow", "")
	require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	got, err := call(ctx, c, "Echo", "after")
	require.NoError(t, err)
	require.Equal(t, "echo:after", got)
}

// TestDialRefused: no server is UNAVAILABLE; Close fails later calls.
func TestDialRefused(t *testing.T) {
	addr := testsvc.FreeAddr(t)
	_, err := Dial(tctx(t), addr, nil)
	require.Equal(t, codes.Unavailable, status.Code(err))

	a, _ := start(t)
	c, err := Dial(tctx(t), a, nil)
	require.NoError(t, err)
	c.Close()
	_, err = call(tctx(t), c, "Echo", "")
	require.Equal(t, codes.Canceled, status.Code(err))
}
