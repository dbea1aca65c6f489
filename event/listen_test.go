package event

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/event/internal/zmtp"
	"github.com/crescent-kv/crescent/internal/netx"
)

// logWatch is a slog handler that reports, once per listener name, that
// its accept loop backed off.
type logWatch struct{ backoff chan string }

func (w *logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w *logWatch) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *logWatch) WithGroup(string) slog.Handler            { return w }
func (w *logWatch) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "backing off") {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "listener" {
			select {
			case w.backoff <- a.Value.String():
			default:
			}
		}
		return true
	})
	return nil
}

func endpointOf(t *testing.T, ep string) zmtp.Endpoint {
	e, err := zmtp.Parse(ep)
	require.NoError(t, err)
	return e
}

// Out of fds, both of the publisher's listeners fail to accept; once fds
// are back, the peers that waited in the backlog are served and a new
// subscriber gets live and replayed batches.
func TestPublisherSurvivesFDExhaustion(t *testing.T) {
	ctx := testCtx(t)
	w := &logWatch{backoff: make(chan string, 16)}
	p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		Logger: slog.New(w)})
	require.NoError(t, p.Publish(storedN(0)))

	var old syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old))
	// Let finalizers of earlier tests' files run now, not free an fd in
	// the middle of the exhaustion.
	runtime.GC()
	runtime.GC()
	fds := netx.ExhaustFDs(t, 64)
	restored := false
	defer func() {
		if !restored {
			netx.RestoreFDs(t, fds, old)
		}
	}()
	// One fd for each peer: it waits in the backlog while accept fails.
	free := func() {
		syscall.Close(fds[len(fds)-1])
		fds = fds[:len(fds)-1]
	}
	backedOff := func(name string) {
		for {
			select {
			case got := <-w.backoff:
				if got == name {
					return
				}
			case <-ctx.Done():
				ents, _ := os.ReadDir("/proc/self/fd")
				t.Fatalf("accept on %s never failed (%d fds open, %d fillers)", name, len(ents), len(fds))
			}
		}
	}
	// topUp takes any fd freed meanwhile.
	topUp := func() {
		for {
			fd, err := syscall.Dup(0)
			if err != nil {
				return
			}
			fds = append(fds, fd)
		}
	}
	free()
	live, err := net.Dial("tcp", endpointOf(t, p.Endpoint()).Addr)
	topUp()
	require.NoError(t, err)
	defer live.Close()
	backedOff("kv events pub")
	// The PUB loop, retrying, may take the next fd freed before the dial
	// does: then free one more.
	var rep net.Conn
	for i := range 3 {
		t.Logf("dial replay, attempt %d, %d filler fds", i, len(fds))
		free()
		if rep, err = net.Dial("tcp", endpointOf(t, p.ReplayEndpoint()).Addr); err == nil {
			topUp()
			break
		}
		require.ErrorIs(t, err, syscall.EMFILE)
	}
	require.NoError(t, err)
	defer rep.Close()
	backedOff("kv events replay")
	netx.RestoreFDs(t, fds, old)
	restored = true

	// The peer that waited gets the handshake and, once subscribed, live
	// batches.
	c, err := zmtp.Handshake(live, zmq4.Sub, false, 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, c.Write(zmtp.AppendMsg(nil, []byte{1})))
	require.NoError(t, p.WaitSubscribers(ctx, 1))
	require.NoError(t, p.Publish(storedN(1)))
	require.NoError(t, live.SetReadDeadline(time.Now().Add(testTimeout)))
	msg, err := c.ReadMsg()
	require.NoError(t, err)
	require.Len(t, msg, 3)
	r, err := zmtp.Handshake(rep, zmq4.Dealer, false, 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, r.Write(zmtp.AppendMsg(nil, []byte{}, make([]byte, 8))))
	require.NoError(t, rep.SetReadDeadline(time.Now().Add(testTimeout)))
	msg, err = r.ReadMsg()
	require.NoError(t, err)
	require.Len(t, msg, 4, "replay of seq 0")

	// A new subscriber connects to both and gets everything.
	col := newCollect()
	subscribe(t, col.config(Source{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), StartSeq: Ptr(uint64(0))}))
	require.NoError(t, p.WaitSubscribers(ctx, 2))
	require.NoError(t, p.Publish(storedN(2)))
	col.waitFor(t, ctx, "3 events", func(c *collect) bool { return c.events == 3 })
}

// Handshaked peers that never subscribe are idle: at MaxConns they are
// closed to make room, and a subscriber still gets in.
func TestPublisherEvictsIdleAtCap(t *testing.T) {
	ctx := testCtx(t)
	p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", MaxConns: 2})
	e := endpointOf(t, p.Endpoint())
	const idle = 10
	var closed atomic.Int32
	done := make(chan struct{}, idle)
	var conns []*zmtp.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
		for range conns {
			<-done
		}
	}()
	for range idle {
		c, err := zmtp.DialConn(ctx, e, zmq4.Sub)
		require.NoError(t, err)
		conns = append(conns, c)
		go func() {
			defer func() { done <- struct{}{} }()
			if _, err := c.ReadMsg(); err != nil && !errors.Is(err, net.ErrClosed) {
				closed.Add(1)
			}
		}()
	}
	col := newCollect()
	subscribe(t, col.config(Source{Endpoint: p.Endpoint()}))
	require.NoError(t, p.WaitSubscribers(ctx, 1))
	require.NoError(t, p.Publish(storedN(0)))
	col.waitFor(t, ctx, "the event", func(c *collect) bool { return c.events == 1 })
	// All but the one idle peer that fits beside the subscriber are gone.
	require.Eventually(t, func() bool { return closed.Load() >= idle-1 }, testTimeout, time.Millisecond)
	assert.Equal(t, 1, p.Stats().Subscribers)
}

// A publisher that sends more than MaxMessageSize is disconnected with an
// error wrapping ErrMalformed, before the message is buffered.
func TestSubscriberBoundsMessages(t *testing.T) {
	ctx := testCtx(t)
	ln, err := zmtp.Listen(endpointOf(t, "tcp://127.0.0.1:0"))
	require.NoError(t, err)
	srv := zmtp.Serve(ln, zmtp.ServerConfig{Type: zmq4.Pub}, func(_ context.Context, c *zmtp.Conn) {
		if _, err := c.ReadMsg(); err != nil { // the subscription
			return
		}
		// Announce 1 GiB, send 2 KiB.
		hdr := binary.BigEndian.AppendUint64([]byte{0x02}, 1<<30)
		_ = c.Write(hdr)
		_ = c.Write(make([]byte, 2048))
		c.ReadMsg() // until the subscriber hangs up
	})
	defer srv.Close()
	errs := make(chan error, 16)
	cfg := SubscriberConfig{
		Sources:        []Source{{Endpoint: zmtp.BoundEndpoint(ln, endpointOf(t, "tcp://127.0.0.1:0"))}},
		OnBatch:        func(Delivery) {},
		OnError:        func(_ string, err error) { errs <- err },
		MaxMessageSize: 1 << 20,
	}
	s := subscribe(t, cfg)
	select {
	case err := <-errs:
		require.ErrorIs(t, err, ErrMalformed)
		require.ErrorIs(t, err, zmtp.ErrLimit)
		assert.Contains(t, err.Error(), "MaxMessageSize")
	case <-ctx.Done():
		t.Fatal("no error")
	}
	s.Close()

	cfg.MaxFrames = 3
	_, err = Subscribe(cfg)
	require.ErrorIs(t, err, ErrConfig)
}

// Allow turns subscribers away by address on the PUB and replay sockets
// (the master's protected default) before a ZMTP greeting is read.
func TestPublisherAllow(t *testing.T) {
	ctx := testCtx(t)
	var refused atomic.Int32
	p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		Allow: func(net.Addr) bool { refused.Add(1); return false }})
	for _, ep := range []string{p.Endpoint(), p.ReplayEndpoint()} {
		c, err := zmtp.DialConn(ctx, endpointOf(t, ep), zmq4.Sub)
		if err == nil {
			errc := make(chan error, 1)
			go func() { _, err := c.ReadMsg(); errc <- err }()
			select {
			case err = <-errc:
			case <-time.After(5 * time.Second): // still connected: served
			}
			c.Close()
		}
		require.Error(t, err, "%s served a refused peer", ep)
	}
	assert.EqualValues(t, 2, refused.Load())
	assert.Zero(t, p.Stats().Subscribers)
}
