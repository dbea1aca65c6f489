package tcp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"github.com/crescent-kv/crescent/internal/testutil"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/tcp"
)

// These tests speak to the server with hand-written frames, as a
// reference (Mooncake) client would.

func dialRaw(tb testing.TB, n *node) *net.TCPConn {
	tb.Helper()
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n.tr.Port())))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c.(*net.TCPConn)
}

func header(size, addr uint64, op uint8) []byte {
	b := make([]byte, tcp.HeaderSize)
	tcp.Header{Size: size, Addr: addr, Opcode: op}.Put(b)
	return b
}

func send(tb testing.TB, c net.Conn, parts ...[]byte) {
	tb.Helper()
	for _, p := range parts {
		if _, err := c.Write(p); err != nil {
			tb.Fatalf("write: %v", err)
		}
	}
}

func readStatus(tb testing.TB, c net.Conn) uint64 {
	tb.Helper()
	var b [tcp.StatusSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		tb.Fatalf("reading status: %v", err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

// readToEOF reads what the server sends until it closes the connection.
// A reset after the server refused unread bytes counts as a close.
func readToEOF(tb testing.TB, c net.Conn) []byte {
	tb.Helper()
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			tb.Fatalf("server did not close the connection (got %d bytes)", len(out))
		}
		return out
	}
}

func TestServerV2Write(t *testing.T) {
	b := newNode(t, "b", 1<<20, tcp.Config{})
	c := dialRaw(t, b)
	payload := make([]byte, 300<<10)
	testutil.Fill(payload, 1)
	clear(b.buf)
	send(t, c, header(uint64(len(payload)), b.addr(17), tcp.OpWrite|tcp.V2Flag), payload)
	if st := readStatus(t, c); st != tcp.StatusOK {
		t.Fatalf("status %#x", st)
	}
	// The OK comes after the bytes landed.
	if !bytes.Equal(b.buf[17:17+len(payload)], payload) {
		t.Fatal("acknowledged write not in target memory")
	}
	if b.buf[16] != 0 || b.buf[17+len(payload)] != 0 {
		t.Fatal("write spilled outside its range")
	}
}

func TestServerV2Read(t *testing.T) {
	b := newNode(t, "b", 1<<20, tcp.Config{})
	testutil.Fill(b.buf, 2)
	c := dialRaw(t, b)
	send(t, c, header(200<<10, b.addr(33), tcp.OpRead|tcp.V2Flag))
	if st := readStatus(t, c); st != tcp.StatusOK {
		t.Fatalf("status %#x", st)
	}
	got := make([]byte, 200<<10)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if want := b.buf[33 : 33+200<<10]; !bytes.Equal(got, want) {
		t.Fatalf("read data: %s", testutil.FirstDiff(got, want))
	}
}

// TestServerOneRequestThenEOF is the reference's default client: a new
// connection per transfer, v1 framing, closed after the request.
func TestServerOneRequestThenEOF(t *testing.T) {
	b := newNode(t, "b", 1<<20, tcp.Config{})
	t.Run("write", func(t *testing.T) {
		clear(b.buf)
		payload := make([]byte, 100<<10)
		testutil.Fill(payload, 3)
		in0 := b.tr.Stats().ServerBytesIn
		c := dialRaw(t, b)
		send(t, c, header(uint64(len(payload)), b.addr(0), tcp.OpWrite), payload)
		c.CloseWrite()
		if got := readToEOF(t, c); len(got) != 0 {
			t.Fatalf("v1 write got %d reply bytes", len(got))
		}
		testutil.Eventually(t, "v1 write to land", func() bool { return b.tr.Stats().ServerBytesIn-in0 == uint64(len(payload)) })
		if !bytes.Equal(b.buf[:len(payload)], payload) {
			t.Fatal("v1 write not in target memory")
		}
	})
	t.Run("read", func(t *testing.T) {
		testutil.Fill(b.buf, 4)
		c := dialRaw(t, b)
		send(t, c, header(64<<10, b.addr(5), tcp.OpRead))
		c.CloseWrite()
		got := readToEOF(t, c)
		if want := b.buf[5 : 5+64<<10]; !bytes.Equal(got, want) {
			t.Fatalf("v1 read: %s", testutil.FirstDiff(got, want))
		}
	})
}

// TestServerPipelined sends many requests in one go on one connection;
// replies come back in order.
func TestServerPipelined(t *testing.T) {
	b := newNode(t, "b", 4<<20, tcp.Config{})
	clear(b.buf)
	c := dialRaw(t, b)
	const n = 64
	var req bytes.Buffer
	payloads := make([][]byte, n)
	for i := range n {
		size := 1 + i*977
		payloads[i] = make([]byte, size)
		testutil.Fill(payloads[i], uint64(i))
		off := uint64(i * 64 << 10)
		req.Write(header(uint64(size), b.addr(0)+off, tcp.OpWrite|tcp.V2Flag))
		req.Write(payloads[i])
		req.Write(header(uint64(size), b.addr(0)+off, tcp.OpRead|tcp.V2Flag))
	}
	// Write from another goroutine: the replies may fill the socket
	// buffers before all requests are sent.
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(req.Bytes())
		errc <- err
	}()
	for i := range n {
		if st := readStatus(t, c); st != tcp.StatusOK {
			t.Fatalf("write %d: status %#x", i, st)
		}
		if st := readStatus(t, c); st != tcp.StatusOK {
			t.Fatalf("read %d: status %#x", i, st)
		}
		got := make([]byte, len(payloads[i]))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, payloads[i]) {
			t.Fatalf("read %d after write %d: %s", i, i, testutil.FirstDiff(got, payloads[i]))
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestServerRejects: each bad request gets the rejected status (v2) or a
// bare close (v1), and the server keeps serving other connections.
func TestServerRejects(t *testing.T) {
	b := newNode(t, "b", 1<<20, tcp.Config{})
	base, end := b.addr(0), b.addr(len(b.buf))
	rejected := make([]byte, 8)
	binary.LittleEndian.PutUint64(rejected, tcp.StatusRejected)
	cases := []struct {
		name string
		req  []byte
		want []byte
	}{
		{"v2 write size 0", header(0, base, tcp.OpWrite|tcp.V2Flag), rejected},
		{"v2 read size 0", header(0, base, tcp.OpRead|tcp.V2Flag), rejected},
		{"v1 read size 0", header(0, base, tcp.OpRead), nil},
		{"v2 read wrapping", header(16, ^uint64(0)-7, tcp.OpRead|tcp.V2Flag), rejected},
		{"v2 write wrapping", header(1<<63, 1<<63+1, tcp.OpWrite|tcp.V2Flag), rejected},
		{"v2 read unregistered", header(4096, 0x1000, tcp.OpRead|tcp.V2Flag), rejected},
		{"v2 write straddling end", header(16, end-8, tcp.OpWrite|tcp.V2Flag), rejected},
		{"v2 read before start", header(16, base-8, tcp.OpRead|tcp.V2Flag), rejected},
		{"v1 write unregistered", header(4096, 0x1000, tcp.OpWrite), nil},
		{"v1 read past end", header(1, end, tcp.OpRead), nil},
		{"v2 write past end, payload sent", append(header(64<<10, end-100, tcp.OpWrite|tcp.V2Flag), make([]byte, 64<<10)...), rejected},
		{"valid v2 read then bad one", append(header(8, base, tcp.OpRead|tcp.V2Flag), header(8, end, tcp.OpRead|tcp.V2Flag)...),
			append(append(okStatus(), b.buf[:8]...), rejected...)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := b.tr.Stats().Rejected
			c := dialRaw(t, b)
			send(t, c, tc.req)
			if got := readToEOF(t, c); !bytes.Equal(got, tc.want) {
				t.Fatalf("server sent % x, want % x", got, tc.want)
			}
			if got := b.tr.Stats().Rejected - before; got != 1 {
				t.Fatalf("Rejected grew by %d, want 1", got)
			}
			checkServes(t, b)
		})
	}
}

func okStatus() []byte { return binary.LittleEndian.AppendUint64(nil, tcp.StatusOK) }

// checkServes makes one good v2 request on a new connection.
func checkServes(tb testing.TB, b *node) {
	tb.Helper()
	c := dialRaw(tb, b)
	send(tb, c, header(8, b.addr(0), tcp.OpRead|tcp.V2Flag))
	if st := readStatus(tb, c); st != tcp.StatusOK {
		tb.Fatalf("good request after a bad one: status %#x", st)
	}
	got := make([]byte, 8)
	if _, err := io.ReadFull(c, got); err != nil {
		tb.Fatal(err)
	}
	c.Close()
}

func TestServerGarbage(t *testing.T) {
	b := newNode(t, "b", 1<<20, tcp.Config{})
	random := make([]byte, 1000)
	testutil.Fill(random, 9)
	cases := []struct {
		name string
		data []byte
	}{
		{"http request", []byte("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")},
		{"random bytes", random},
		{"all ones", bytes.Repeat([]byte{0xff}, 48)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, b)
			send(t, c, tc.data)
			readToEOF(t, c)
			checkServes(t, b)
		})
	}
	t.Run("partial header then EOF", func(t *testing.T) {
		c := dialRaw(t, b)
		send(t, c, header(8, b.addr(0), tcp.OpRead|tcp.V2Flag)[:10])
		c.CloseWrite()
		if got := readToEOF(t, c); len(got) != 0 {
			t.Fatalf("got %d bytes", len(got))
		}
		checkServes(t, b)
	})
}

// TestServerPinsRegion: unregistering a buffer waits for a WRITE into it
// that is in progress, and refuses new requests at once.
func TestServerPinsRegion(t *testing.T) {
	const size = 8 << 20
	for _, wait := range []bool{true, false} {
		name := "remove waits"
		if !wait {
			name = "remove gives up at its deadline"
		}
		t.Run(name, func(t *testing.T) {
			b := newNode(t, "b", size, tcp.Config{})
			clear(b.buf)
			payload := make([]byte, size)
			testutil.Fill(payload, 5)
			c := dialRaw(t, b)
			send(t, c, header(size, b.addr(0), tcp.OpWrite|tcp.V2Flag), payload[:1<<20])
			// Bytes in target memory mean the server holds the lease.
			testutil.Eventually(t, "first bytes to land", func() bool { return bytes.Equal(b.buf[:4096], payload[:4096]) })

			ctx := context.Background()
			if !wait {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
			}
			removed := make(chan error, 1)
			go func() {
				_, err := b.reg.Remove(ctx, b.addr(0))
				removed <- err
			}()
			// Once Remove started, new requests are refused.
			testutil.Eventually(t, "new requests to be refused", func() bool {
				c2 := dialRaw(t, b)
				defer c2.Close()
				send(t, c2, header(8, b.addr(0), tcp.OpRead|tcp.V2Flag))
				return readStatus(t, c2) == tcp.StatusRejected
			})
			if !wait {
				err := <-removed
				if !errors.Is(err, transport.ErrBufferBusy) {
					t.Fatalf("Remove with an expiring context: %v, want ErrBufferBusy", err)
				}
			} else {
				select {
				case err := <-removed:
					t.Fatalf("Remove returned (%v) while a write into the region is in flight", err)
				default:
				}
			}
			send(t, c, payload[1<<20:])
			if st := readStatus(t, c); st != tcp.StatusOK {
				t.Fatalf("status %#x", st)
			}
			if !bytes.Equal(b.buf, payload) {
				t.Fatal("pinned write incomplete")
			}
			if wait {
				select {
				case err := <-removed:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(20 * time.Second):
					t.Fatal("Remove still waiting after the write finished")
				}
			}
		})
	}
}
