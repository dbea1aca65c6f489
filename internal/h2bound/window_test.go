package h2bound

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
)

// serverData writes n bytes of the server's DATA on stream sid through
// c, in frames of up to 16 KiB.
func serverData(t *testing.T, c *conn, sid uint32, n int) {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	for n > 0 {
		m := min(n, 16384)
		require.NoError(t, fr.WriteData(sid, false, make([]byte, m)))
		n -= m
	}
	_, err := c.Write(b.Bytes())
	require.NoError(t, err)
}

// TestWindowsAnyChunking: the server's send windows h2bound keeps are
// the client's WINDOW_UPDATEs and SETTINGS_INITIAL_WINDOW_SIZE less the
// server's DATA, however the client's bytes are cut into reads.
func TestWindowsAnyChunking(t *testing.T) {
	var buf bytes.Buffer
	buf.WriteString(clientPreface)
	fr := http2.NewFramer(&buf, nil)
	require.NoError(t, fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}))
	connInc := int64(0)
	streamInc := map[uint32]int64{}
	for sid := uint32(1); sid < 30; sid += 2 {
		writeCall(t, fr, sid, grpcMessage(int(sid)*10), nil, false, false)
		if sid != 29 { // its window ends shut
			inc := int64(sid) * 1000
			require.NoError(t, fr.WriteWindowUpdate(sid, uint32(inc)))
			streamInc[sid] += inc
		}
		require.NoError(t, fr.WriteWindowUpdate(0, uint32(sid)))
		connInc += int64(sid)
		require.NoError(t, fr.WritePing(false, [8]byte{1, 2, 3}))
		if sid == 15 {
			require.NoError(t, fr.WriteSettingsAck())
			require.NoError(t, fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 3000}))
		}
	}
	in := buf.Bytes()
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 100 {
		b := New(Config{MaxBytes: 1 << 30, Stall: time.Second, WriteTimeout: time.Hour})
		c := b.wrap(&chunkConn{in: in, r: r, max: 1 + round*20})
		readAll(t, c, r)
		spent := map[uint32]int64{}
		var connSpent int64
		for sid := uint32(1); sid < 30; sid += 4 {
			n := int(sid) * 300
			serverData(t, c, sid, n)
			spent[sid] += int64(n)
			connSpent += int64(n)
		}
		c.mu.Lock()
		require.Equal(t, initialWindow+connInc-connSpent, c.connWin, "round %d", round)
		require.Len(t, c.streams, 15)
		shut := 0
		for sid, s := range c.streams {
			want := 3000 + streamInc[sid] - spent[sid]
			require.Equal(t, want, s.win, "stream %d, round %d", sid, round)
			if want <= 0 {
				shut++
			}
		}
		require.Equal(t, 1, shut)
		require.Equal(t, shut, c.shut)
		c.mu.Unlock()
	}
}

// starveConn is a connection whose client sent the preface, default
// settings and one whole call on stream 1, and then waits.
func starveConn(t *testing.T, wt time.Duration, extra func(fr *http2.Framer)) (*Bound, *conn) {
	var buf bytes.Buffer
	buf.WriteString(clientPreface)
	fr := http2.NewFramer(&buf, nil)
	require.NoError(t, fr.WriteSettings())
	writeCall(t, fr, 1, grpcMessage(100), nil, false, false)
	if extra != nil {
		extra(fr)
	}
	idle := make(chan struct{})
	t.Cleanup(func() { close(idle) })
	b := New(Config{MaxBytes: 1 << 20, Stall: time.Second, WriteTimeout: wt})
	c := b.wrap(&chunkConn{r: rand.New(rand.NewPCG(5, 6)), max: 100, idle: idle})
	clientSendsBytes(t, c, buf.Bytes())
	require.Equal(t, int64(105), b.Held())
	return b, c
}

// TestShutWindowCloses: a call whose answer waits on a window the client
// keeps shut (the call's own, or the connection's) loses its connection
// after WriteTimeout, and its bytes come back.
func TestShutWindowCloses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra func(fr *http2.Framer)
	}{
		{"stream window", func(fr *http2.Framer) { require.NoError(t, fr.WriteWindowUpdate(0, 1<<20)) }},
		{"connection window", func(fr *http2.Framer) { require.NoError(t, fr.WriteWindowUpdate(1, 1<<20)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, c := starveConn(t, 100*time.Millisecond, tc.extra)
			serverData(t, c, 1, initialWindow) // one of the windows is spent
			require.Eventually(t, func() bool { return b.Starved() == 1 }, 10*time.Second, 5*time.Millisecond,
				"a window kept shut did not close the connection")
			assert.Zero(t, b.Held())
			c.mu.Lock()
			assert.True(t, c.closed)
			c.mu.Unlock()
		})
	}
}

// TestOpenWindowKeepsConn: a window that opens again in time, or one
// that is spent when no call waits on it, closes nothing.
func TestOpenWindowKeepsConn(t *testing.T) {
	const wt = 500 * time.Millisecond // far longer than the waits below
	t.Run("opened", func(t *testing.T) {
		b, c := starveConn(t, wt, nil)
		serverData(t, c, 1, initialWindow) // both windows spent
		clientSends(t, c, func(fr *http2.Framer) {
			require.NoError(t, fr.WriteWindowUpdate(0, 1000))
			require.NoError(t, fr.WriteWindowUpdate(1, 1000))
		})
		time.Sleep(2 * wt)
		assert.Zero(t, b.Starved())
		assert.Equal(t, int64(105), b.Held())
	})
	t.Run("answered", func(t *testing.T) {
		b, c := starveConn(t, wt, nil)
		serverData(t, c, 1, initialWindow)
		serverEnds(t, c, 1)
		time.Sleep(2 * wt)
		assert.Zero(t, b.Starved())
		assert.Zero(t, b.Held())
	})
}

// clientSends makes c read frames the client sends now.
func clientSends(t *testing.T, c *conn, frames func(fr *http2.Framer)) {
	var buf bytes.Buffer
	frames(http2.NewFramer(&buf, nil))
	clientSendsBytes(t, c, buf.Bytes())
}

// clientSendsBytes makes c read b, bytes the client sends now.
func clientSendsBytes(t *testing.T, c *conn, b []byte) {
	c.Conn.(*chunkConn).in = b
	p := make([]byte, 4096)
	for read := 0; read < len(b); {
		n, err := c.Read(p)
		require.NoError(t, err)
		read += n
	}
}

// serverEnds writes the server's trailers of stream sid through c: the
// call ends.
func serverEnds(t *testing.T, c *conn, sid uint32) {
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: []byte{0x88}, EndHeaders: true, EndStream: true}))
	_, err := c.Write(buf.Bytes())
	require.NoError(t, err)
}

// TestDripWindowCloses: a client that opens a shut window a byte at a
// time, never for long enough to let the answer out, loses its
// connection once the answer has waited WriteTimeout in all, however
// short each wait.
func TestDripWindowCloses(t *testing.T) {
	const wt = 200 * time.Millisecond
	b, c := starveConn(t, wt, func(fr *http2.Framer) { require.NoError(t, fr.WriteWindowUpdate(0, 1<<20)) })
	serverData(t, c, 1, initialWindow) // the call's window is spent
	deadline := time.Now().Add(20 * wt)
	for b.Starved() == 0 && time.Now().Before(deadline) {
		time.Sleep(wt / 5)
		clientSends(t, c, func(fr *http2.Framer) { require.NoError(t, fr.WriteWindowUpdate(1, 1)) })
		serverData(t, c, 1, 1) // spent again at once
	}
	require.EqualValues(t, 1, b.Starved(), "a client opening its window a byte at a time kept the answer waiting")
	assert.Zero(t, b.Held())
}

// TestBriefShutsKeepConn: calls that each wait on a shut window for
// less than WriteTimeout keep a long-lived connection, however long
// their waits add up to across calls.
func TestBriefShutsKeepConn(t *testing.T) {
	const wt = 400 * time.Millisecond
	b, c := starveConn(t, wt, func(fr *http2.Framer) { require.NoError(t, fr.WriteWindowUpdate(0, 1<<30)) })
	for i := range 8 {
		sid := uint32(3 + 2*i)
		clientSends(t, c, func(fr *http2.Framer) {
			require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: []byte{0x82}, EndHeaders: true, EndStream: true}))
		})
		serverData(t, c, sid, initialWindow) // shut
		// A quarter of wt each: twice wt over the eight calls.
		time.Sleep(wt / 4)
		clientSends(t, c, func(fr *http2.Framer) { require.NoError(t, fr.WriteWindowUpdate(sid, 1000)) })
		serverEnds(t, c, sid) // answered
	}
	assert.Zero(t, b.Starved(), "waits of different calls were added up")
	c.mu.Lock()
	assert.False(t, c.closed)
	c.mu.Unlock()
}
