package service

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/storepb"
)

// smallSendBuf gives every connection it accepts a small send buffer, so
// an answer of a few tens of KiB fills what the kernel buffers.
type smallSendBuf struct{ net.Listener }

func (smallSendBuf) wrap(l net.Listener) net.Listener { return smallSendBuf{l} }

func (l smallSendBuf) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
	}
	return c, err
}

// TestGRPCClientThatStopsReading: a gRPC client that stops reading its
// answers loses its connection after the write timeout, as a crpc
// client does, and the request bytes its calls held come back; before,
// the master's write waited on it for ever, holding them.
func TestGRPCClientThatStopsReading(t *testing.T) {
	svc, addr := writeBoundMaster(t, smallSendBuf{}.wrap)
	p := dialH2(t, addr)
	require.NoError(t, p.c.(*net.TCPConn).SetReadBuffer(4096))
	// Windows as large as they go: the master may send all it has.
	require.NoError(t, p.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1}))
	require.NoError(t, p.fr.WriteWindowUpdate(0, 1<<31-1-65535))
	const calls = 40
	p.existCalls(calls, newWindows())

	// The client reads nothing from here on.
	heldReturns(t, svc, "the request bytes stay held while the master waits on a client that does not read")
	// The master closed the connection: reading it now ends in an error,
	// after some answers at most (what the socket buffers held), not all.
	require.Less(t, p.answersUntilClosed(0), calls, "every answer was sent: the master did not close the connection")
}

// TestGRPCClientThatWithholdsWindow: a gRPC client that reads (and
// answers pings) but never opens its flow-control window again loses
// its connection once answers have waited on that window for the write
// timeout, and the request bytes its calls held come back; before, no
// write blocked, so nothing timed out, and they stayed held until the
// client left.
func TestGRPCClientThatWithholdsWindow(t *testing.T) {
	svc, addr := writeBoundMaster(t, nil)
	p := dialH2(t, addr)
	// 8 answers of 20 KB against the default 64 KiB windows: three fit.
	const calls = 8
	p.existCalls(calls, newWindows())
	heldReturns(t, svc, "the request bytes stay held while answers wait on a client's shut window")
	require.Less(t, p.answersUntilClosed(0), calls, "every answer was sent within a 64 KiB window")
	assert.EqualValues(t, 1, svc.GRPCWindowsStarved())
}

// TestGRPCClientThatDripsWindow: the same with a client that opens its
// connection window by one byte every 50 ms, so no answer ever waits
// the write timeout (300 ms) at a stretch: it loses its connection once
// an answer has waited that long in all, and before, it held the
// request bytes for as long as it dripped.
func TestGRPCClientThatDripsWindow(t *testing.T) {
	svc, addr := writeBoundMaster(t, nil)
	p := dialH2(t, addr)
	const calls = 8
	p.existCalls(calls, newWindows())
	closed := make(chan int)
	go func() { closed <- p.answersUntilClosed(50 * time.Millisecond) }()
	heldReturns(t, svc, "the request bytes stay held while a client opens its window a byte at a time")
	require.Less(t, <-closed, calls, "every answer was sent")
	assert.EqualValues(t, 1, svc.GRPCWindowsStarved())
}

// writeBoundMaster serves a master whose writes to a client time out
// after 300 ms, through wrap's listener if wrap is set.
func writeBoundMaster(t *testing.T, wrap func(net.Listener) net.Listener) (*Service, string) {
	e := mastertest.New(t, nil)
	var l net.Listener
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l = tl
	if wrap != nil {
		l = wrap(tl)
	}
	svc := New(e.M, WithCRPC(crpc.ServerConfig{WriteTimeout: 300 * time.Millisecond}, netx.Config{}))
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ctx, l) }()
	t.Cleanup(func() {
		stop()
		assert.NoError(t, <-served)
	})
	return svc, tl.Addr().String()
}

// existCalls sends calls BatchExistKey calls of 10,000 one-byte keys
// (each request 30 KB, each answer 20 KB) within the master's windows:
// all but the last byte of every request first (reading the master's
// window updates), so no call is answered before the last is sent.
func (p *h2peer) existCalls(calls int, win *h2windows) {
	t := p.t
	keys := make([]string, storepb.MaxBatchItems)
	for i := range keys {
		keys[i] = "a"
	}
	body, err := proto.Marshal(&storepb.BatchExistKeyRequest{Keys: keys})
	require.NoError(t, err)
	msg := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))
	msg = append(msg, body...)
	send := func(sid uint32, b []byte, end bool) {
		require.True(t, p.sendData(sid, b, end, win), "the master closed the connection")
	}
	for i := range calls {
		sid := uint32(1 + 2*i)
		require.NoError(t, p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: p.headersFor(storepb.Master_BatchExistKey_FullMethodName), EndHeaders: true}))
		win.stream[sid] = win.initial
		send(sid, msg[:len(msg)-1], false)
	}
	for i := range calls {
		sid := uint32(1 + 2*i)
		send(sid, msg[len(msg)-1:], true)
	}
}

// heldReturns waits until svc's gRPC calls hold request bytes, then
// until they hold none again.
func heldReturns(t *testing.T, svc *Service, msg string) {
	b := func() int64 { held, _ := svc.GRPCRequestBytes(); return held }
	require.Eventually(t, func() bool { return b() > 0 }, 10*time.Second, time.Millisecond, "the call's request never held")
	require.Eventually(t, func() bool { return b() == 0 }, 20*time.Second, 10*time.Millisecond, msg)
}

// answersUntilClosed reads the connection, acknowledging settings and
// pings but opening no window (or, every drip if positive, the
// connection's by one byte), until the master closes it, and returns
// how many calls were answered; the connection must close within 20 s.
func (p *h2peer) answersUntilClosed(drip time.Duration) int {
	t := p.t
	var wmu sync.Mutex // the framer's writes; reads are this goroutine's
	if drip > 0 {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			tk := time.NewTicker(drip)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
				}
				wmu.Lock()
				err := p.fr.WriteWindowUpdate(0, 1)
				wmu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	if err := p.c.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		return 0
	}
	answered := 0
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			var ne net.Error
			assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection is still open")
			return answered
		}
		wmu.Lock()
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				answered++
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				p.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				p.fr.WritePing(true, f.Data)
			}
		}
		wmu.Unlock()
	}
}

// TestGRPCWindowsFollowClient: the send windows h2bound keeps follow a
// live grpc-go client's: after answers of 600 KB on one connection,
// far past the 64 KiB it starts with, the connection's window is still
// open (the client opened it as it read), and no connection was closed
// for a shut window.
func TestGRPCWindowsFollowClient(t *testing.T) {
	e := mastertest.New(t, nil)
	addr, svc := serveBounded(t, e, 64<<20, 3*time.Second)
	mc := dialSigned(t, addr)
	keys := make([]string, storepb.MaxBatchItems)
	for i := range keys {
		keys[i] = "a"
	}
	for range 30 {
		rep, err := mc.BatchExistKey(context.Background(), &storepb.BatchExistKeyRequest{Keys: keys})
		require.NoError(t, err)
		require.Len(t, rep.GetResults(), len(keys))
	}
	wins := svc.h2.Load().SendWindows()
	require.Len(t, wins, 1)
	assert.Positive(t, wins[0], "the connection's send window, as h2bound sees it")
	assert.Zero(t, svc.GRPCWindowsStarved())
}
