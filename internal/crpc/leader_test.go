package crpc

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestCallerReadsOwnReply: with one call in flight the caller reads its
// reply itself; no other goroutine reads it and hands it over (the
// dedicated reader goroutine did, for every call).
func TestCallerReadsOwnReply(t *testing.T) {
	lis := listen(t)
	serveOn(t, lis)
	c := dial(t, lis.Addr().String(), WithPing(time.Hour, 10*time.Second))
	cc := current(c)
	const calls = 2000
	for i := range calls {
		got, err := call(tctx(t), c, "Echo", fmt.Sprint(i))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint("echo:", i), got)
	}
	assert.Same(t, cc, current(c))
	// The background reader takes over a connection idle for idleRead
	// (a descheduled test loop can leave one so) and yields to the next
	// caller; a reply it reads meanwhile is handed over. That is rare.
	t.Logf("%d of %d replies handed over", cc.handed.Load(), calls)
	assert.Less(t, cc.handed.Load(), int64(calls/10), "replies handed over by another reader")
}

// TestCallersCancelAtRandom: many callers, many of them giving up at
// random points (deadlines, cancels, some while they hold the read role
// in the middle of a frame), never see another call's reply and never
// break the stream.
func TestCallersCancelAtRandom(t *testing.T) {
	lis := listen(t)
	_, svc, _ := serveOn(t, lis)
	c := dial(t, lis.Addr().String(), WithPing(time.Hour, 10*time.Second))
	cc := current(c)
	ctx := tctx(t)
	const callers, each = 12, 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	codesSeen := map[codes.Code]int{}
	for g := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for i := range each {
				// Up to 128 KiB: replies span many reads, so interrupts
				// land in the middle of frames.
				v := fmt.Sprintf("%d/%d/", g, i) + strings.Repeat("v", r.IntN(128<<10))
				cctx, cancel := context.WithCancel(ctx)
				switch r.IntN(4) {
				case 0:
					cctx, cancel = context.WithTimeout(ctx, time.Duration(r.IntN(2000))*time.Microsecond)
				case 1:
					time.AfterFunc(time.Duration(r.IntN(2000))*time.Microsecond, cancel)
				}
				method := "Echo"
				if r.IntN(10) == 0 {
					method = "Block" // ends only with its context
					cctx, cancel = context.WithTimeout(ctx, time.Duration(r.IntN(5000))*time.Microsecond)
				}
				got, err := call(cctx, c, method, v)
				cancel()
				code := status.Code(err)
				mu.Lock()
				codesSeen[code]++
				mu.Unlock()
				switch {
				case err == nil:
					assert.Equal(t, "echo:"+v, got, "another call's reply")
				case code == codes.DeadlineExceeded || code == codes.Canceled:
				default:
					t.Errorf("call %d/%d: %v", g, i, err)
				}
			}
		})
	}
	// Block's handler announces itself; nobody needs to know.
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-svc.entered:
			case <-stop:
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-drained
	t.Logf("outcomes: %v", codesSeen)
	got, err := call(ctx, c, "Echo", "after")
	require.NoError(t, err)
	assert.Equal(t, "echo:after", got)
	assert.Same(t, cc, current(c), "the stream survived")
	assert.Positive(t, codesSeen[codes.OK])
}

// fakeServer accepts one crpc connection and gives the test its frames
// and the raw connection, so a test can write replies byte by byte.
func fakeServer(t *testing.T) (addr string, conns <-chan net.Conn) {
	lis := listen(t)
	t.Cleanup(func() { lis.Close() })
	ch := make(chan net.Conn, 4)
	go func() {
		for {
			nc, err := lis.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { nc.Close() })
			p := make([]byte, prefaceLen)
			if _, err := io.ReadFull(nc, p); err != nil {
				continue
			}
			if _, err := nc.Write(preface()); err != nil {
				continue
			}
			ch <- nc
		}
	}()
	return lis.Addr().String(), ch
}

func replyFrame(t *testing.T, id uint32, v string) []byte {
	body, err := proto.Marshal(wrapperspb.String(v))
	require.NoError(t, err)
	out := append(make([]byte, headerLen, headerLen+len(body)), body...)
	require.NoError(t, putHeader(out, id, kindReply, DefaultMaxFrame))
	return out
}

// nextRequest reads frames until a request (cancels, pings pass).
func nextRequest(t *testing.T, rd *reader) frame {
	for {
		f, err := rd.next()
		require.NoError(t, err)
		if f.kind == kindRequest {
			return f
		}
	}
}

// TestHalfFrameResumes: a reply cut in the middle (of its header, or of
// its body) when its caller's deadline ends is read on from where it
// stopped by the next reader; the next call's reply is intact.
func TestHalfFrameResumes(t *testing.T) {
	for _, cut := range []int{4, headerLen + 3} {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			addr, conns := fakeServer(t)
			c := dial(t, addr, WithPing(time.Hour, 10*time.Second))
			cc := current(c)
			nc := <-conns
			rd := newReader(nc, DefaultMaxFrame)
			errc := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				_, err := call(ctx, c, "Echo", "first")
				errc <- err
			}()
			first := replyFrame(t, nextRequest(t, rd).id, "echo:first"+strings.Repeat("x", 100))
			_, err := nc.Write(first[:cut])
			require.NoError(t, err)
			assert.Equal(t, codes.DeadlineExceeded, status.Code(<-errc))

			go func() {
				_, err := call(tctx(t), c, "Echo", "second")
				errc <- err
			}()
			id := nextRequest(t, rd).id
			// Wait for the second caller to have taken the read role (it
			// interrupts the background reader if that one has it).
			require.Eventually(t, func() bool { return cc.waiting.Load() == 0 && len(cc.role) == 0 && !cc.bgReading.Load() },
				10*time.Second, time.Millisecond)
			_, err = nc.Write(first[cut:])
			require.NoError(t, err)
			_, err = nc.Write(replyFrame(t, id, "echo:second"))
			require.NoError(t, err)
			require.NoError(t, <-errc)
			assert.Same(t, cc, current(c))
			assert.False(t, cc.broken())
		})
	}
}

// timeoutErr is a read deadline's error.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

// stutter returns its bytes one at a time, a timeout between each.
type stutter struct {
	b    []byte
	tick bool
}

func (s *stutter) Read(p []byte) (int, error) {
	if s.tick = !s.tick; s.tick {
		return 0, timeoutErr{}
	}
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	p[0] = s.b[0]
	s.b = s.b[1:]
	return 1, nil
}

// TestFrameReaderResumes: frames come out whole however many timeouts
// interrupt them.
func TestFrameReaderResumes(t *testing.T) {
	var b []byte
	want := []string{"a", strings.Repeat("b", 70<<10), ""}
	for i, v := range want {
		b = append(b, replyFrame(t, uint32(i+1), v)...)
	}
	b = append(b, control(9, kindPong)...)
	fr := newFrameReader(&stutter{b: b}, DefaultMaxFrame)
	timeouts := 0
	var got []frame
	for len(got) < len(want)+1 {
		f, err := fr.next()
		if err != nil {
			require.True(t, isTimeout(err), "%v", err)
			timeouts++
			continue
		}
		got = append(got, f)
	}
	assert.Greater(t, timeouts, len(b)/2)
	for i, v := range want {
		var m wrapperspb.StringValue
		require.NoError(t, proto.Unmarshal(got[i].body, &m))
		assert.Equal(t, uint32(i+1), got[i].id)
		assert.Equal(t, v, m.Value)
	}
	assert.Equal(t, frame{id: 9, kind: kindPong}, got[len(want)])
	_, err := fr.next()
	for isTimeout(err) {
		_, err = fr.next()
	}
	assert.ErrorIs(t, err, io.EOF)
}

// TestIdleCloseDetected: a server that closes an idle connection is seen
// at once (the background reader reads an idle connection), so the next
// call dials a fresh connection and succeeds instead of failing on the
// dead one.
func TestIdleCloseDetected(t *testing.T) {
	lis := listen(t)
	serveOn(t, lis, ServerConfig{IdleTimeout: 50 * time.Millisecond})
	c := dial(t, lis.Addr().String(), WithPing(time.Hour, 10*time.Second))
	for range 3 {
		cc := current(c)
		got, err := call(tctx(t), c, "Echo", "x")
		require.NoError(t, err)
		require.Equal(t, "echo:x", got)
		require.Eventually(t, cc.broken, 10*time.Second, time.Millisecond, "the server's close went unseen")
		got, err = call(tctx(t), c, "Echo", "y")
		require.NoError(t, err)
		require.Equal(t, "echo:y", got)
		assert.NotSame(t, cc, current(c))
	}
}

// TestPingWhileCallerReads: a caller holding the read role (its handler
// blocks) delivers the keepalive's pongs, so the connection stays up
// while other calls come and go.
func TestPingWhileCallerReads(t *testing.T) {
	lis := listen(t)
	_, svc, _ := serveOn(t, lis)
	c := dial(t, lis.Addr().String(), WithPing(5*time.Millisecond, 10*time.Second))
	cc := current(c)
	ctx := tctx(t)
	errc := make(chan error, 1)
	go func() {
		got, err := call(ctx, c, "Block", "")
		if err == nil && got != "released" {
			err = fmt.Errorf("got %q", got)
		}
		errc <- err
	}()
	<-svc.entered
	start := cc.pongs.Load()
	require.Eventually(t, func() bool { return cc.pongs.Load() >= start+20 }, 30*time.Second, time.Millisecond)
	for i := range 50 {
		got, err := call(ctx, c, "Echo", fmt.Sprint(i))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint("echo:", i), got)
	}
	close(svc.release)
	require.NoError(t, <-errc)
	assert.Same(t, cc, current(c))
	assert.False(t, cc.broken())
}

// TestPollWait: with WithPollWait a caller about to block waits in ppoll
// first; replies, deadlines and the stream behave as without it.
func TestPollWait(t *testing.T) {
	lis := listen(t)
	_, svc, _ := serveOn(t, lis)
	c := dial(t, lis.Addr().String(), WithPollWait(200*time.Microsecond), WithPing(time.Hour, 10*time.Second))
	cc := current(c)
	require.NotNil(t, cc.pc, "a plain TCP connection polls")
	for i := range 200 {
		got, err := call(tctx(t), c, "Echo", fmt.Sprint(i))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint("echo:", i), got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	_, err := call(ctx, c, "Block", "")
	cancel()
	<-svc.entered
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	got, err := call(tctx(t), c, "Echo", "after")
	require.NoError(t, err)
	assert.Equal(t, "echo:after", got)
	assert.Same(t, cc, current(c))
	assert.Positive(t, cc.pc.polled.Load())
}
