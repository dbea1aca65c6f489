package service

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/storepb"
)

// sendPartial starts a Ping call on stream sid whose request declares
// declared bytes and sends the first send of them, within the server's
// flow-control windows, then stops; it stops sooner if the server
// refuses the call. It returns false if the server closed the
// connection first.
func (p *h2peer) sendPartial(sid uint32, declared, send int, win *h2windows) bool {
	require.NoError(p.t, p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: p.headers(), EndHeaders: true}))
	msg := make([]byte, 5+send)
	binary.BigEndian.PutUint32(msg[1:5], uint32(declared))
	if _, ok := win.stream[sid]; !ok {
		win.stream[sid] = win.initial
	}
	return p.sendData(sid, msg, false, win)
}

// sendData sends b on stream sid within the server's flow-control
// windows, reading the server's frames while they are spent, and ends
// the stream with b's last byte if end. It stops early if the server
// refuses the call, and returns false if the server closed the
// connection first.
func (p *h2peer) sendData(sid uint32, b []byte, end bool, win *h2windows) bool {
	for len(b) > 0 && !slices.Contains(win.refused, sid) {
		n := min(len(b), 16384, win.conn, win.stream[sid])
		if n <= 0 {
			if !p.readWindows(win) {
				return false
			}
			continue
		}
		if err := p.fr.WriteData(sid, end && n == len(b), b[:n]); err != nil {
			return false
		}
		b = b[n:]
		win.conn -= n
		win.stream[sid] -= n
	}
	return true
}

// h2windows is a client's view of the server's flow-control windows.
type h2windows struct {
	initial, conn int
	stream        map[uint32]int
	goAway        *http2.GoAwayFrame // the server's, if it sent one
	refused       []uint32           // streams the server refused
}

func newWindows() *h2windows {
	return &h2windows{initial: 65535, conn: 65535, stream: map[uint32]int{}}
}

// readWindows reads one frame, applying window updates and settings;
// false once the connection is closed.
func (p *h2peer) readWindows(win *h2windows) bool {
	require.NoError(p.t, p.c.SetReadDeadline(time.Now().Add(20*time.Second)))
	f, err := p.fr.ReadFrame()
	if err != nil {
		var ne net.Error
		require.False(p.t, errors.As(err, &ne) && ne.Timeout(), "no frame from the server in 20 s")
		return false
	}
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				for s := range win.stream {
					win.stream[s] += int(v) - win.initial
				}
				win.initial = int(v)
			}
			p.fr.WriteSettingsAck()
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			win.conn += int(f.Increment)
		} else {
			win.stream[f.StreamID] += int(f.Increment)
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			p.fr.WritePing(true, f.Data)
		}
	case *http2.GoAwayFrame:
		win.goAway = f
		return false
	case *http2.RSTStreamFrame:
		if f.ErrCode == http2.ErrCodeRefusedStream {
			win.refused = append(win.refused, f.StreamID)
		}
	}
	return true
}

// TestGRPCRequestBytesBounded: the request bytes gRPC holds across calls
// are bounded by the crpc buffered-bytes bound. A peer that sends three
// 3 MiB requests half-way holds two halves, and the third is refused
// (REFUSED_STREAM) when it reaches the bound, since waiting for room the
// peer's own stalled requests hold would never end. A call that can wait
// does, and the stalled peer's connection is closed once its requests
// are past the frame timeout; every byte comes back, and calls go on.
func TestGRPCRequestBytesBounded(t *testing.T) {
	const bound = 4 << 20
	addr, svc := serveBounded(t, mastertest.New(t, nil), bound, 300*time.Millisecond)
	hog := dialH2(t, addr)
	win := newWindows()
	for i := range 3 {
		require.True(t, hog.sendPartial(uint32(1+2*i), 3<<20, 3<<19, win), "request %d", i)
	}
	for len(win.refused) < 1 {
		require.True(t, hog.readWindows(win), "the server closed the connection")
	}
	require.Equal(t, []uint32{5}, win.refused)
	require.Nil(t, win.goAway, "the server ended the connection")
	b := svc.h2.Load()
	require.NotNil(t, b)
	require.LessOrEqual(t, b.Peak(), int64(bound), "request bytes held at once")
	require.Greater(t, b.Peak(), int64(bound)-16384, "the bound was not reached: the test proves nothing")
	require.Equal(t, int64(2*(5+3<<19)), b.Held(), "the two requests not refused")
	require.EqualValues(t, 1, b.Refused())

	ping := bigPinger(t, addr)

	// The hog holds 3 MiB in stalled requests: a 2 MiB call waits for
	// room, and gets it when the stalled peer's connection is closed.
	time.Sleep(400 * time.Millisecond) // the stalled requests are past the frame timeout
	require.NoError(t, ping(2<<20))
	for closed := false; !closed; {
		closed = !hog.readWindows(win)
	}
	require.Nil(t, win.goAway, "the server ended the connection for another reason")

	// Calls of 1 MiB requests, one after another: the bytes of each come
	// back (four would fill the bound).
	for i := range 20 {
		require.NoError(t, ping(1<<20), "call %d", i)
	}
	require.Eventually(t, func() bool { return b.Held() == 0 }, 10*time.Second, 10*time.Millisecond, "held %d after the calls", b.Held())
}

// serveBounded serves e's master with gRPC request bytes bounded at
// bound and frame timeout stall.
func serveBounded(t *testing.T, e *mastertest.Env, bound int64, stall time.Duration) (string, *Service) {
	// Writes time out after stall too: a window h2bound wrongly saw shut
	// would close a peer's connection within the test.
	return serveAddr(t, e.M, WithCRPC(crpc.ServerConfig{MaxFrame: 2 << 20, MaxBufferedBytes: bound, FrameTimeout: stall, WriteTimeout: stall}, netx.Config{}))
}

// bigPinger returns a signed Ping of client 1 carrying n bytes more (an
// unknown field) to the master at addr.
func bigPinger(t *testing.T, addr string) func(n int) error {
	mc := dialSigned(t, addr)
	return func(n int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		req := &storepb.PingRequest{ClientId: pbID(mastertest.Client(1))}
		req.ProtoReflect().SetUnknown(append(protowireBytes(1000, n), make([]byte, n)...))
		_, err := mc.Ping(ctx, req)
		return err
	}
}

// protowireBytes is the tag and length of a bytes field number num of n
// bytes (an unknown field to the receiver).
func protowireBytes(num, n int) []byte {
	b := binary.AppendUvarint(nil, uint64(num)<<3|2)
	return binary.AppendUvarint(b, uint64(n))
}

// TestGRPCConcurrentCallsPastTheBound: sixteen concurrent 1 MiB calls on
// one connection, over a 4 MiB bound. The client interleaves their DATA,
// so the server cannot wait for room for one while the others, queued
// behind it on the same connection, hold it: it refuses those it cannot
// admit (REFUSED_STREAM, UNAVAILABLE to the caller, who may retry)
// instead of stalling the connection until the frame timeout closes it
// and fails every call on it.
func TestGRPCConcurrentCallsPastTheBound(t *testing.T) {
	const bound = 4 << 20
	addr, svc := serveBounded(t, mastertest.New(t, nil), bound, 3*time.Second)
	ping := bigPinger(t, addr)
	for round := range 3 {
		var wg sync.WaitGroup
		errs := make([]error, 16)
		for i := range errs {
			wg.Go(func() { errs[i] = ping(1 << 20) })
		}
		wg.Wait()
		ok := 0
		for i, err := range errs {
			if err == nil {
				ok++
				continue
			}
			require.Equal(t, codes.Unavailable, status.Code(err), "round %d call %d: %v", round, i, err)
			require.ErrorContains(t, err, "REFUSED_STREAM", "round %d call %d", round, i)
		}
		require.Positive(t, ok, "round %d", round)
		b := svc.h2.Load()
		require.LessOrEqual(t, b.Peak(), int64(bound))
		require.Eventually(t, func() bool { return b.Held() == 0 }, 10*time.Second, 10*time.Millisecond, "held %d", b.Held())
		// The connection goes on.
		require.NoError(t, ping(100))
	}
}
