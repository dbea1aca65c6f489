package crpc

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// testCall is a call on a connection whose context the test ends.
func testCall(t *testing.T, deadline time.Time) (*serverCall, context.CancelFunc) {
	t.Helper()
	sc := &serverConn{}
	sc.ctx, sc.cancel = context.WithCancel(context.Background())
	t.Cleanup(sc.cancel)
	return &serverCall{sc: sc, deadline: deadline}, sc.cancel
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestCallContextDeadline: a call's context ends at its deadline whether
// or not the handler asked for Done before it, and children, causes and
// AfterFunc see the same end.
func TestCallContextDeadline(t *testing.T) {
	t.Run("Err before Done", func(t *testing.T) {
		c, _ := testCall(t, time.Now().Add(20*time.Millisecond))
		dl, ok := c.Deadline()
		require.True(t, ok)
		assert.Equal(t, c.deadline, dl)
		require.NoError(t, c.Err())
		require.Eventually(t, func() bool { return c.Err() != nil }, 10*time.Second, time.Millisecond)
		assert.ErrorIs(t, c.Err(), context.DeadlineExceeded)
		assert.True(t, closed(c.Done()), "Done after the deadline")
		assert.ErrorIs(t, c.Err(), context.DeadlineExceeded)
		assert.ErrorIs(t, context.Cause(c), context.DeadlineExceeded)
		c.cancel() // the call returns: the first error stays
		assert.ErrorIs(t, c.Err(), context.DeadlineExceeded)
	})
	t.Run("Done before", func(t *testing.T) {
		c, _ := testCall(t, time.Now().Add(20*time.Millisecond))
		child, stop := context.WithCancel(c)
		defer stop()
		ran := make(chan struct{})
		context.AfterFunc(c, func() { close(ran) })
		select {
		case <-child.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a child of the call's context outlived its deadline")
		}
		<-ran
		assert.ErrorIs(t, c.Err(), context.DeadlineExceeded)
		assert.ErrorIs(t, child.Err(), context.DeadlineExceeded)
		assert.ErrorIs(t, context.Cause(child), context.DeadlineExceeded)
	})
	t.Run("no deadline", func(t *testing.T) {
		c, _ := testCall(t, time.Time{})
		_, ok := c.Deadline()
		assert.False(t, ok)
		assert.NoError(t, c.Err())
		assert.False(t, closed(c.Done()))
	})
}

// TestCallContextCancel: the call's end (a cancel from the client, the
// handler returning, the connection ending) reaches Err, Done, children
// and AfterFunc, made before or after it.
func TestCallContextCancel(t *testing.T) {
	for _, early := range []bool{false, true} {
		c, _ := testCall(t, time.Now().Add(time.Hour))
		var child context.Context
		var stop context.CancelFunc
		var ran atomic.Bool
		if early {
			child, stop = context.WithCancel(c)
			context.AfterFunc(c, func() { ran.Store(true) })
		}
		c.cancel()
		if !early {
			child, stop = context.WithCancel(c)
			context.AfterFunc(c, func() { ran.Store(true) })
		}
		assert.ErrorIs(t, c.Err(), context.Canceled, "early %v", early)
		assert.True(t, closed(c.Done()))
		<-child.Done()
		assert.ErrorIs(t, child.Err(), context.Canceled)
		assert.Eventually(t, ran.Load, 10*time.Second, time.Millisecond)
		stop()
	}

	c, endConn := testCall(t, time.Time{})
	endConn()
	assert.ErrorIs(t, c.Err(), context.Canceled, "the connection ended")
	assert.True(t, closed(c.Done()))
}

// TestCallContextValues: the call is found for Detach; other values come
// from the connection's context.
func TestCallContextValues(t *testing.T) {
	type key struct{}
	c, _ := testCall(t, time.Time{})
	c.sc.ctx = context.WithValue(c.sc.ctx, key{}, "conn")
	assert.Same(t, c, c.Value(callKey{}))
	assert.Equal(t, "conn", c.Value(key{}))
	assert.Equal(t, "conn", context.WithValue(c, struct{}{}, 1).Value(key{}))
}

// TestCallContextAllocs: a call whose handler answers at once makes no
// context of the package's (before: a timer context, its timer, an entry
// in the connection's children and a value layer), and neither side
// allocates for the method's name or the caller's read interrupt.
func TestCallContextAllocs(t *testing.T) {
	lis := listen(t)
	svc := &inlineSvc{entered: make(chan struct{}, 4), let: make(chan struct{})}
	s := NewServer(ServerConfig{Inline: func(string) func() bool { return func() bool { return true } }})
	s.RegisterService(&inlineDesc, svc)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	defer func() { s.Stop(); <-done }()
	c := dial(t, lis.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in, out := wrapperspb.String("x"), new(wrapperspb.StringValue)
	peek := func() {
		if err := c.Invoke(ctx, "/crpc.test.Inline/Peek", in, out); err != nil {
			t.Fatal(err)
		}
	}
	peek()
	// Client and server, one round trip: the request and reply
	// messages, the caller's wait, the server's call: 11 (18 before
	// this call context, the method name looked up without a copy and
	// the read interrupt bound once per connection).
	assert.LessOrEqual(t, testing.AllocsPerRun(500, peek), 12.0)
}
