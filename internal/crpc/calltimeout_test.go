package crpc

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// awaitErr waits for a call's outcome; the bound is a hang detector, not
// a measure of how late the call ended.
func awaitErr(t *testing.T, res chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the call did not end")
		return nil
	}
}

// TestCallTimeoutSilentServer: with WithCallTimeout and no deadline on
// the context, calls to a server that never answers end
// DEADLINE_EXCEEDED: the one reading the connection for its own reply
// (interrupted by the sweeper) and those waiting behind it. The server
// is told (a cancel per call) and, having sent nothing, is pinged.
func TestCallTimeoutSilentServer(t *testing.T) {
	ss := newSilentServer(t, true)
	// A ping timeout longer than the test: only the sweeper can end the
	// caller blocked reading.
	c := dial(t, ss.lis.Addr().String(), WithCallTimeout(100*time.Millisecond), WithPing(time.Minute, time.Minute))
	assert.Equal(t, 100*time.Millisecond, c.CallTimeout())
	const calls = 3
	res := make(chan error, calls)
	for range calls {
		go func() { _, err := call(context.Background(), c, "Echo", "x"); res <- err }()
	}
	for range calls {
		err := awaitErr(t, res)
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		assert.ErrorContains(t, err, "call timeout")
	}
	ss.waitKinds(t, kindRequest, kindCancel, kindPing)
	cc := current(c)
	cc.mu.Lock()
	assert.Empty(t, cc.pending, "expired calls are forgotten")
	cc.mu.Unlock()
}

// TestCallTimeoutServerSide: the handler of a call made with no context
// deadline gets the call timeout as its deadline, and its context ends
// when the call expires; a reply that comes after the expiry is dropped
// and the connection goes on serving calls.
func TestCallTimeoutServerSide(t *testing.T) {
	lis := listen(t)
	ws := &waitSvc{entered: make(chan struct{}, 4), ended: make(chan error, 4), dl: make(chan time.Duration, 4)}
	s := NewServer(ServerConfig{})
	s.RegisterService(&waitDesc, ws)
	s.RegisterService(&testDesc, &testSvc{release: make(chan struct{}), entered: make(chan struct{}, 16)})
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	defer func() { s.Stop(); <-done }()
	c := dial(t, lis.Addr().String(), WithCallTimeout(time.Second))

	res := make(chan error, 1)
	go func() {
		res <- c.Invoke(context.Background(), "/crpc.test.Wait/Wait", wrapperspb.String(""), new(wrapperspb.StringValue))
	}()
	<-ws.entered
	d := <-ws.dl
	assert.Greater(t, d, time.Duration(0), "the handler has a deadline")
	assert.LessOrEqual(t, d, time.Second)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(awaitErr(t, res)))
	select {
	case err := <-ws.ended:
		assert.Error(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the handler's context did not end")
	}

	// A context deadline earlier than the call timeout still rules.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	go func() {
		res <- c.Invoke(ctx, "/crpc.test.Wait/Wait", wrapperspb.String(""), new(wrapperspb.StringValue))
	}()
	<-ws.entered
	assert.LessOrEqual(t, <-ws.dl, 20*time.Millisecond)
	err := awaitErr(t, res)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.NotContains(t, err.Error(), "call timeout", "ended by its context, not the sweeper")
	<-ws.ended

	got, err := call(tctx(t), c, "Echo", "after")
	require.NoError(t, err)
	assert.Equal(t, "echo:after", got)
}

// TestCallTimeoutLateReply: a reply that arrives after its call expired
// goes nowhere, and the calls around it get their own replies.
func TestCallTimeoutLateReply(t *testing.T) {
	lis := listen(t)
	svc := &slowSvc{gate: make(chan struct{})}
	s := NewServer(ServerConfig{})
	s.RegisterService(&slowDesc, svc)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	defer func() { s.Stop(); <-done }()
	c := dial(t, lis.Addr().String(), WithCallTimeout(50*time.Millisecond))

	err := c.Invoke(context.Background(), "/crpc.test.Slow/Slow", wrapperspb.String("late"), new(wrapperspb.StringValue))
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	close(svc.gate) // the handler ignores its context: its reply now goes out, to nobody
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := new(wrapperspb.StringValue)
			v := string(rune('a' + i))
			if assert.NoError(t, c.Invoke(tctx(t), "/crpc.test.Slow/Slow", wrapperspb.String(v), out)) {
				assert.Equal(t, "slow:"+v, out.Value)
			}
		}()
	}
	wg.Wait()
}

// slowSvc answers once gate is closed, whatever its context says.
type slowSvc struct{ gate chan struct{} }

var slowDesc = grpc.ServiceDesc{
	ServiceName: "crpc.test.Slow",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Slow", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		<-srv.(*slowSvc).gate
		return wrapperspb.String("slow:" + in.Value), nil
	}}},
}
