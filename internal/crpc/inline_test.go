package crpc

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// inlineSvc: Hold waits until Let is called (Detaching first when asked
// "detach", twice when asked "twice"); Peek reports whether a Hold is
// waiting right now.
type inlineSvc struct {
	entered chan struct{}
	let     chan struct{}
	holding atomic.Int32
}

func inlineHandler(f func(s *inlineSvc, ctx context.Context, in string) string) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		return wrapperspb.String(f(srv.(*inlineSvc), ctx, in.Value)), nil
	}
}

var inlineDesc = grpc.ServiceDesc{
	ServiceName: "crpc.test.Inline",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Hold", Handler: inlineHandler(func(s *inlineSvc, ctx context.Context, in string) string {
			switch in {
			case "detach":
				Detach(ctx)
			case "twice":
				Detach(ctx)
				Detach(ctx)
			}
			s.holding.Add(1)
			defer s.holding.Add(-1)
			s.entered <- struct{}{}
			select {
			case <-s.let:
				return "held"
			case <-ctx.Done():
				return "gone"
			}
		})},
		{MethodName: "Let", Handler: inlineHandler(func(s *inlineSvc, _ context.Context, _ string) string {
			s.let <- struct{}{}
			return "let"
		})},
		{MethodName: "Peek", Handler: inlineHandler(func(s *inlineSvc, _ context.Context, in string) string {
			if s.holding.Load() > 0 {
				return in + ":beside a hold"
			}
			return in + ":alone"
		})},
	},
}

// serveInline serves inlineSvc with every method inline while inline
// holds true.
func serveInline(t *testing.T, inline *atomic.Bool) (*inlineSvc, string) {
	t.Helper()
	lis := listen(t)
	svc := &inlineSvc{entered: make(chan struct{}, 4), let: make(chan struct{})}
	s := NewServer(ServerConfig{Inline: func(string) func() bool { return inline.Load }})
	s.RegisterService(&inlineDesc, svc)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	t.Cleanup(func() {
		s.Stop()
		require.ErrorIs(t, <-done, ErrServerStopped)
	})
	return svc, lis.Addr().String()
}

func inlineCall(ctx context.Context, c *Conn, method, v string) (string, error) {
	out := new(wrapperspb.StringValue)
	err := c.Invoke(ctx, "/crpc.test.Inline/"+method, wrapperspb.String(v), out)
	return out.Value, err
}

// hold starts a Hold(v) on c and returns once its handler waits.
func hold(t *testing.T, ctx context.Context, svc *inlineSvc, c *Conn, v string) chan string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		r, err := inlineCall(ctx, c, "Hold", v)
		assert.NoError(t, err)
		got <- r
	}()
	select {
	case <-svc.entered:
	case <-ctx.Done():
		t.Fatal("Hold never ran")
	}
	return got
}

// TestInlineCallsHoldTheirConnection: an inline call runs on its
// connection's reader, so the connection's next call runs after it; a
// call on another connection does not wait. With the check false, calls
// run beside each other as before.
func TestInlineCallsHoldTheirConnection(t *testing.T) {
	for _, on := range []bool{true, false} {
		var inline atomic.Bool
		inline.Store(on)
		svc, addr := serveInline(t, &inline)
		ctx := tctx(t)
		c1, c2 := dial(t, addr), dial(t, addr)
		held := hold(t, ctx, svc, c1, "stay")
		peeked := make(chan string, 1)
		go func() {
			r, err := inlineCall(ctx, c1, "Peek", "c1")
			assert.NoError(t, err)
			peeked <- r
		}()
		if !on {
			// Beside the hold: answered while it waits.
			require.Equal(t, "c1:beside a hold", <-peeked)
		}
		r, err := inlineCall(ctx, c2, "Peek", "c2")
		require.NoError(t, err)
		require.Equal(t, "c2:beside a hold", r, "another connection is not held")
		time.Sleep(50 * time.Millisecond) // let c1's Peek reach the server
		r, err = inlineCall(ctx, c2, "Let", "")
		require.NoError(t, err)
		require.Equal(t, "let", r)
		require.Equal(t, "held", <-held)
		if on {
			require.Equal(t, "c1:alone", <-peeked, "c1's next call ran after the inline one")
		}
	}
}

// TestInlineDetach: an inline call that Detaches before it waits lets
// its connection's other calls through, even the one it waits for; a
// second Detach does nothing (one reader at a time), and the calls after
// are served in order.
func TestInlineDetach(t *testing.T) {
	for _, v := range []string{"detach", "twice"} {
		var inline atomic.Bool
		inline.Store(true)
		svc, addr := serveInline(t, &inline)
		ctx := tctx(t)
		c := dial(t, addr)
		held := hold(t, ctx, svc, c, v)
		r, err := inlineCall(ctx, c, "Peek", "c")
		require.NoError(t, err)
		require.Equal(t, "c:beside a hold", r)
		r, err = inlineCall(ctx, c, "Let", "")
		require.NoError(t, err)
		require.Equal(t, "let", r)
		require.Equal(t, "held", <-held)
		for i := range 20 {
			r, err := inlineCall(ctx, c, "Peek", "n")
			require.NoError(t, err, i)
			require.Equal(t, "n:alone", r)
		}
	}
}

// TestDetachedCallOutlivesItsConnection: the connection ends while a
// detached call waits; the call ends with it and the server stops clean
// (no reader or handler left; goleak checks).
func TestDetachedCallOutlivesItsConnection(t *testing.T) {
	var inline atomic.Bool
	inline.Store(true)
	svc, addr := serveInline(t, &inline)
	ctx := tctx(t)
	c, err := Dial(ctx, addr)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		_, err := inlineCall(ctx, c, "Hold", "detach")
		got <- err
	}()
	<-svc.entered
	require.NoError(t, c.Close())
	require.Error(t, <-got)
	require.Eventually(t, func() bool { return svc.holding.Load() == 0 }, 10*time.Second, time.Millisecond,
		"the held call saw its connection end")
}

// TestDetachOutsideInline: Detach in a call with a goroutine of its own
// (or any other context) does nothing.
func TestDetachOutsideInline(t *testing.T) {
	Detach(context.Background())
	var inline atomic.Bool
	svc, addr := serveInline(t, &inline)
	ctx := tctx(t)
	c := dial(t, addr)
	held := hold(t, ctx, svc, c, "twice")
	r, err := inlineCall(ctx, c, "Let", "")
	require.NoError(t, err)
	require.Equal(t, "let", r)
	require.Equal(t, "held", <-held)
	for range 20 {
		r, err := inlineCall(ctx, c, "Peek", "n")
		require.NoError(t, err)
		require.Equal(t, "n:alone", r)
	}
}
