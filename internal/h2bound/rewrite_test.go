package h2bound

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
)

// chunkConn serves in to reads in random pieces and keeps what is
// written to it.
type chunkConn struct {
	net.Conn // nil: only Read, Write and Close are used
	in       []byte
	r        *rand.Rand
	max      int
	out      bytes.Buffer
	idle     chan struct{} // when set, reads past the input wait for it to close
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(c.in) == 0 && c.idle != nil {
		<-c.idle // a peer that sent everything and waits
	}
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.in[:min(len(c.in), 1+c.r.IntN(c.max))])
	c.in = c.in[n:]
	return n, nil
}

func (c *chunkConn) Write(p []byte) (int, error) { return c.out.Write(p) }
func (c *chunkConn) Close() error                { return nil }

func (c *chunkConn) SetWriteDeadline(time.Time) error { return nil }

// readAll reads c to its end in random piece sizes (some below 64
// bytes, which Read serves through its own buffer).
func readAll(t *testing.T, c *conn, r *rand.Rand) []byte {
	var got []byte
	buf := make([]byte, 70000)
	for {
		n, err := c.Read(buf[:1+r.IntN(len(buf))])
		got = append(got, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return got
		}
		require.NoError(t, err)
	}
}

// grpcMessage is a gRPC length-prefixed message of n bytes.
func grpcMessage(n int) []byte {
	m := make([]byte, 5+n)
	binary.BigEndian.PutUint32(m[1:5], uint32(n))
	for i := range n {
		m[5+i] = byte(i)
	}
	return m
}

// writeCall writes a call's HEADERS (with a CONTINUATION when cont) and
// its message in DATA frames cut at the given sizes (the last frame
// takes the rest), padded when pad; it returns how many DATA frames.
func writeCall(t *testing.T, fr *http2.Framer, sid uint32, msg []byte, cuts []int, pad, cont bool) (frames int) {
	if cont {
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: []byte{0x82}}))
		require.NoError(t, fr.WriteContinuation(sid, true, []byte{0x84}))
	} else {
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: []byte{0x82, 0x84}, EndHeaders: true}))
	}
	for _, n := range cuts {
		n = min(n, len(msg))
		writeData(t, fr, sid, false, msg[:n], pad)
		msg = msg[n:]
		frames++
	}
	for len(msg) > 0 {
		n := min(len(msg), 16384)
		writeData(t, fr, sid, n == len(msg), msg[:n], pad)
		msg = msg[n:]
		frames++
	}
	return frames
}

func writeData(t *testing.T, fr *http2.Framer, sid uint32, end bool, b []byte, pad bool) {
	if pad {
		require.NoError(t, fr.WriteDataPadded(sid, end, b, make([]byte, 7)))
		return
	}
	require.NoError(t, fr.WriteData(sid, end, b))
}

// TestRewritePassesAnyChunking: with room for every call, what the server
// reads is exactly what the client sent, however it is cut into reads;
// each call holds its DATA bytes until the server ends it.
func TestRewritePassesAnyChunking(t *testing.T) {
	var buf bytes.Buffer
	buf.WriteString(clientPreface)
	fr := http2.NewFramer(&buf, nil)
	require.NoError(t, fr.WriteSettings())
	var held int64 // DATA payload bytes, padding included, of calls not cancelled
	for sid := uint32(1); sid < 40; sid += 2 {
		n := int(sid) * 997 % 40000
		var cuts []int
		switch sid % 5 {
		case 1:
			cuts = []int{3, 1} // the size split over frames: counted as it comes
		case 2:
			cuts = []int{0} // an empty first DATA frame
		}
		frames := writeCall(t, fr, sid, grpcMessage(n), cuts, sid%3 == 0, sid%4 == 1)
		if sid%7 == 0 {
			require.NoError(t, fr.WriteRSTStream(sid, http2.ErrCodeCancel))
		} else {
			held += int64(5 + n)
			if sid%3 == 0 {
				held += int64(frames * 8) // pad length byte and 7 bytes of padding
			}
		}
		require.NoError(t, fr.WritePing(false, [8]byte{byte(sid)}))
		require.NoError(t, fr.WriteWindowUpdate(0, 1000))
	}
	stream := buf.Bytes()
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 100 {
		b := New(Config{MaxBytes: 1 << 30, Stall: 10 * time.Second})
		cc := &chunkConn{in: stream, r: r, max: 1 + round*700}
		c := b.wrap(cc)
		require.Equal(t, stream, readAll(t, c, r), "round %d", round)
		require.Zero(t, cc.out.Len(), "frames sent to the client")
		require.Zero(t, b.Refused())
		require.Equal(t, held, b.Held())
		var tr bytes.Buffer
		sfr := http2.NewFramer(&tr, nil)
		for sid := uint32(1); sid < 40; sid += 2 {
			require.NoError(t, sfr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: []byte{0x88}, EndHeaders: true, EndStream: true}))
		}
		for p := tr.Bytes(); len(p) > 0; { // the server's trailers, in pieces
			n := min(len(p), 1+r.IntN(20))
			_, err := c.Write(p[:n])
			require.NoError(t, err)
			p = p[n:]
		}
		require.Zero(t, b.Held(), "round %d", round)
		require.NoError(t, c.Close())
	}
}

// TestRewriteRefuses: a DATA frame that finds no room while its own
// connection holds the rest in incomplete requests (so waiting would
// never end) refuses its call: the server reads the call's DATA up to
// that frame, then the client's CANCEL (later DATA of the call may follow
// it, to a server that has closed the call and drops it), and the client
// gets REFUSED_STREAM and every dropped byte back in its connection
// window; the other call passes whole. The same however the bytes are
// cut.
func TestRewriteRefuses(t *testing.T) {
	var buf bytes.Buffer
	buf.WriteString(clientPreface)
	fr := http2.NewFramer(&buf, nil)
	m1, m3 := grpcMessage(80<<10), grpcMessage(80<<10)
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82}, EndHeaders: true}))
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte{0x82}, EndHeaders: true}))
	// Frames of 1-4 KiB: a read spans several.
	data := func(sid uint32, m []byte, from, to int) (sent int) {
		for off := from; off < to; off += 1024 * int(sid+1) / 2 * 2 {
			end := min(off+1024*int(sid+1)/2*2, to)
			if sid == 1 {
				require.NoError(t, fr.WriteData(1, end == len(m), m[off:end]))
				sent += end - off
			} else {
				require.NoError(t, fr.WriteDataPadded(3, end == len(m), m[off:end], []byte{0, 0}))
				sent += end - off + 3
			}
		}
		return sent
	}
	data(1, m1, 0, 64<<10)
	data(3, m3, 0, 24<<10) // passes: 88 KiB and padding held of 90
	// Call 3's next frame finds no room, and the connection holds the
	// rest in incomplete requests: refused.
	dropped := data(3, m3, 24<<10, 32<<10)
	data(1, m1, 64<<10, len(m1))
	dropped += data(3, m3, 32<<10, len(m3))
	stream := buf.Bytes()
	r := rand.New(rand.NewPCG(5, 6))
	for round := range 50 {
		b := New(Config{MaxBytes: 90 << 10, Stall: 10 * time.Second})
		cc := &chunkConn{in: stream, r: r, max: 1 + round*400}
		c := b.wrap(cc)
		got := readAll(t, c, r)
		require.EqualValues(t, 1, b.Refused())

		require.True(t, bytes.HasPrefix(got, []byte(clientPreface)))
		sfr := http2.NewFramer(nil, bytes.NewReader(got[len(clientPreface):]))
		var data1, data3 []byte
		cancelled, late := false, 0
		for {
			f, err := sfr.ReadFrame()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			switch f := f.(type) {
			case *http2.DataFrame:
				switch {
				case f.StreamID == 1:
					data1 = append(data1, f.Data()...)
				case cancelled:
					late += int(f.Header().Length)
				default:
					data3 = append(data3, f.Data()...)
				}
			case *http2.RSTStreamFrame:
				require.EqualValues(t, 3, f.StreamID)
				require.Equal(t, http2.ErrCodeCancel, f.ErrCode)
				cancelled = true
			}
		}
		require.True(t, cancelled, "round %d", round)
		require.Equal(t, m1, data1)
		require.Equal(t, m3[:24<<10], data3, "call 3 before its CANCEL")

		cfr := http2.NewFramer(nil, &cc.out)
		refused, credit := false, 0
		for {
			f, err := cfr.ReadFrame()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				require.EqualValues(t, 3, f.StreamID)
				require.Equal(t, http2.ErrCodeRefusedStream, f.ErrCode)
				refused = true
			case *http2.WindowUpdateFrame:
				require.Zero(t, f.StreamID)
				credit += int(f.Increment)
			default:
				t.Fatalf("unexpected frame to the client: %v", f)
			}
		}
		require.True(t, refused)
		require.Equal(t, dropped, credit+late, "every byte of call 3 after the refusal: credited, or passed to the server")
		require.EqualValues(t, len(m1), b.Held(), "call 1 holds its bytes")
		require.NoError(t, c.Close())
		require.Zero(t, b.Held())
	}
}

// TestRewriteManyRefusals: many calls interleaved in frames of random
// sizes over a small bound, cut into random reads: each call the server
// sees whole is exactly what its client sent, and each refused call's
// DATA before its CANCEL is a prefix of it.
func TestRewriteManyRefusals(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for round := range 40 {
		var buf bytes.Buffer
		buf.WriteString(clientPreface)
		fr := http2.NewFramer(&buf, nil)
		msgs := map[uint32][]byte{}
		sent := map[uint32]int{}
		var open []uint32
		for sid := uint32(1); sid < 60; sid += 2 {
			m := grpcMessage(r.IntN(40000))
			msgs[sid] = m
			require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: []byte{0x82}, EndHeaders: true}))
			open = append(open, sid)
		}
		for len(open) > 0 {
			i := r.IntN(len(open))
			sid := open[i]
			m := msgs[sid]
			n := min(len(m)-sent[sid], 1+r.IntN(9000))
			end := sent[sid]+n == len(m)
			writeData(t, fr, sid, end, m[sent[sid]:sent[sid]+n], sid%3 == 0)
			sent[sid] += n
			if end {
				open = slices.Delete(open, i, i+1)
			}
		}
		// The client then waits: what it sent must come out without
		// more input behind it (the PING last).
		last := [8]byte{'c', 'r', 'e', 's', 'c', 'e', 'n', 't'}
		require.NoError(t, fr.WritePing(false, last))
		stream := buf.Bytes()
		b := New(Config{MaxBytes: 200 << 10, Stall: time.Millisecond})
		cc := &chunkConn{in: stream, r: r, max: 1 + r.IntN(40000), idle: make(chan struct{})}
		c := b.wrap(cc)
		var got []byte
		done := make(chan struct{})
		go func() {
			defer close(done)
			p := make([]byte, 70000)
			for !bytes.HasSuffix(got, stream[len(stream)-17:]) {
				n, err := c.Read(p[:1+r.IntN(len(p))])
				got = append(got, p[:n]...)
				if err != nil {
					return
				}
			}
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			close(cc.idle)
			<-done
			t.Fatalf("round %d: the last frames did not come out without more input", round)
		}
		sfr := http2.NewFramer(nil, bytes.NewReader(got[len(clientPreface):]))
		data := map[uint32][]byte{}
		cancelled := map[uint32]bool{}
		for {
			f, err := sfr.ReadFrame()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, "round %d", round)
			switch f := f.(type) {
			case *http2.DataFrame:
				if !cancelled[f.StreamID] {
					data[f.StreamID] = append(data[f.StreamID], f.Data()...)
				}
			case *http2.RSTStreamFrame:
				cancelled[f.StreamID] = true
			}
		}
		require.EqualValues(t, len(cancelled), b.Refused(), "round %d", round)
		for sid, m := range msgs {
			if cancelled[sid] {
				require.True(t, bytes.HasPrefix(m, data[sid]), "round %d call %d", round, sid)
			} else {
				require.Equal(t, m, data[sid], "round %d call %d", round, sid)
			}
		}
		require.NoError(t, c.Close())
		require.Zero(t, b.Held())
	}
}

// TestRewriteInPlace: reads of gRPC's size are rewritten in the caller's
// buffer; the connection allocates no buffer of its own.
func TestRewriteInPlace(t *testing.T) {
	var buf bytes.Buffer
	buf.WriteString(clientPreface)
	fr := http2.NewFramer(&buf, nil)
	for sid := uint32(1); sid < 20; sid += 2 {
		writeCall(t, fr, sid, grpcMessage(int(sid)*3001), nil, sid%3 == 0, false)
	}
	stream := buf.Bytes()
	b := New(Config{MaxBytes: 1 << 30, Stall: 10 * time.Second})
	c := b.wrap(&chunkConn{in: stream, r: rand.New(rand.NewPCG(9, 10)), max: 40000})
	var got []byte
	p := make([]byte, 32<<10)
	for {
		n, err := c.Read(p)
		got = append(got, p[:n]...)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
	}
	require.Equal(t, stream, got)
	require.Zero(t, cap(c.buf), "bytes of a buffer of its own")
	require.NoError(t, c.Close())
}
