package metadata

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// scripted is a raw handshake peer: every accepted connection is handed
// to serve. It is what Crescent's client meets in the wild (old peers,
// stalled peers, broken peers).
type scripted struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newScripted(t *testing.T, serve func(c net.Conn)) *scripted {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scripted{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *scripted) addr() string { return s.ln.Addr().String() }

// replyWith reads one request frame and answers with raw bytes.
func replyWith(out []byte) func(c net.Conn) {
	return func(c net.Conn) {
		c.SetDeadline(time.Now().Add(wait))
		if _, _, err := ReadFrame(c, DefaultMaxFrame); err != nil {
			return
		}
		c.Write(out)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c)
	}
}

// stall accepts and never answers; it returns when the client closes.
func stall(c net.Conn) { io.Copy(io.Discard, c) }

func TestExchangeDeadline(t *testing.T) {
	s := newScripted(t, stall)
	for _, d := range []time.Duration{time.Millisecond, 50 * time.Millisecond, 300 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		done := make(chan error, 1)
		go func() { _, err := Exchange(ctx, s.addr(), Probe, []byte("{}")); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("deadline %v: err = %v, want context.DeadlineExceeded", d, err)
			}
		case <-time.After(wait):
			t.Fatalf("deadline %v: Exchange ignored its context", d)
		}
		cancel()
	}
}

func TestExchangeCancel(t *testing.T) {
	s := newScripted(t, stall)
	ctx, cancel := context.WithCancel(context.Background()) // no deadline
	done := make(chan error, 1)
	go func() { _, err := Exchange(ctx, s.addr(), Metadata, []byte("{}")); done <- err }()
	time.Sleep(50 * time.Millisecond) // let it reach the read; either phase must honour cancel
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(wait):
		t.Fatal("Exchange ignored cancellation")
	}
}

func TestExchangeBadPeers(t *testing.T) {
	typed := func(tp MsgType, body string) []byte { return frameBytes(tp, body) }
	cases := []struct {
		name  string
		serve func(c net.Conn)
		t     MsgType
		want  error // nil: any error
		body  string
	}{
		{name: "good", serve: replyWith(typed(Probe, `{"status":"success"}`+"\n")), t: Probe, body: `{"status":"success"}` + "\n"},
		{name: "reply of another type", serve: replyWith(typed(Notify, `{}`)), t: Probe, want: ErrBadReply},
		{name: "error reply", serve: replyWith(typed(Metadata, `{"status":"error","reply_msg":"nope"}`)), t: Metadata, want: ErrRejected},
		{name: "error reply without message", serve: replyWith(typed(Metadata, `{"status":"error"}`)), t: Metadata, want: ErrRejected},
		// An old peer that does not know Probe reads "\x03{}" as JSON, fails, and closes.
		{name: "closed without reply", serve: replyWith(nil), t: Probe, want: io.EOF},
		{name: "truncated reply", serve: replyWith(typed(Probe, `{"status":"success"}`)[:12]), t: Probe, want: io.ErrUnexpectedEOF},
		{name: "zero-length reply", serve: replyWith(make([]byte, 8)), t: Probe, want: ErrFrameEmpty},
		{name: "huge reply length", serve: replyWith(binary.LittleEndian.AppendUint64(nil, 1<<40)), t: Probe, want: ErrFrameTooLarge},
		{name: "reset", serve: func(c net.Conn) { c.(*net.TCPConn).SetLinger(0); c.Close() }, t: Probe},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted(t, tc.serve)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			out, err := Exchange(ctx, s.addr(), tc.t, []byte("{}\n"))
			if tc.body != "" {
				if err != nil || string(out) != tc.body {
					t.Fatalf("got %q, %v", out, err)
				}
				return
			}
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("waited for the deadline: %v", err)
			}
		})
	}
}

func TestExchangeDialError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := Exchange(ctx, addr, Probe, []byte("{}")); err == nil {
		t.Fatal("Exchange to a closed port succeeded")
	}
	if err := SendProbe(ctx, "no-port"); err == nil {
		t.Fatal("Exchange to a malformed address succeeded")
	}
}

// TestFetchDescRequest checks the exact request a Metadata exchange sends:
// a typed frame carrying the caller's own descriptor (or {}).
func TestFetchDescRequest(t *testing.T) {
	self := testDesc("127.0.0.1:15003")
	selfJSON, _ := self.Marshal()
	peer := testDesc("127.0.0.1:15004")
	peerJSON, _ := peer.Marshal()
	for _, tc := range []struct {
		name string
		self *SegmentDesc
		want []byte
	}{
		{"with own descriptor", self, frameBytes(Metadata, string(selfJSON))},
		{"without", nil, frameBytes(Metadata, "{}\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan []byte, 1)
			s := newScripted(t, func(c net.Conn) {
				c.SetDeadline(time.Now().Add(wait))
				var hdr [8]byte
				if _, err := io.ReadFull(c, hdr[:]); err != nil {
					return
				}
				body := make([]byte, binary.LittleEndian.Uint64(hdr[:]))
				if _, err := io.ReadFull(c, body); err != nil {
					return
				}
				got <- append(hdr[:], body...)
				c.Write(frameBytes(Metadata, string(peerJSON)))
				c.(*net.TCPConn).CloseWrite()
				io.Copy(io.Discard, c)
			})
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			d, err := FetchDesc(ctx, s.addr(), tc.self)
			if err != nil {
				t.Fatal(err)
			}
			if d.Name != peer.Name || d.Buffers[0].Addr != peer.Buffers[0].Addr {
				t.Fatalf("descriptor %+v", d)
			}
			if req := <-got; string(req) != string(tc.want) {
				t.Fatalf("request % x\nwant    % x", req, tc.want)
			}
		})
	}
}

func TestFetchDescErrors(t *testing.T) {
	cases := []struct {
		name  string
		reply []byte
		want  error
	}{
		{"not ready", frameBytes(Metadata, "null\n"), ErrNoDescriptor},
		{"zero address", frameBytes(Metadata, `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":0,"length":1}]}`), ErrBadDescriptor},
		{"address as string", frameBytes(Metadata, `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":"1","length":1}]}`), ErrBadDescriptor},
		{"not json", frameBytes(Metadata, `{`), ErrBadDescriptor},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newScripted(t, replyWith(tc.reply))
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if _, err := FetchDesc(ctx, s.addr(), nil); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestSendNotifyProbe(t *testing.T) {
	var log notifyLog
	s := startServer(t, ServerConfig{Handlers: Handlers{Notify: log.add}})
	bare := startServer(t, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := SendNotify(ctx, s.Addr(), "me:1", "hello \"world\"\n\x00é"); err != nil {
		t.Fatal(err)
	}
	if got := log.all(); len(got) != 1 || got[0] != (NotifyMsg{"me:1", "hello \"world\"\n\x00é"}) {
		t.Fatalf("notifies %q", got)
	}
	// A server without a Notify handler answers an empty notify_msg,
	// which the reference's sender treats as a failure.
	if err := SendNotify(ctx, bare.Addr(), "me:1", "x"); !errors.Is(err, ErrRejected) {
		t.Fatalf("notify to a server without handler: %v", err)
	}
	if err := SendProbe(ctx, bare.Addr()); err != nil {
		t.Fatal(err)
	}
	odd := newScripted(t, replyWith(frameBytes(Probe, `{"status":"busy"}`)))
	if err := SendProbe(ctx, odd.addr()); !errors.Is(err, ErrBadReply) {
		t.Fatalf("probe reply status busy: %v", err)
	}
	notJSON := newScripted(t, replyWith(frameBytes(Notify, `x`)))
	if err := SendNotify(ctx, notJSON.addr(), "a", "b"); !errors.Is(err, ErrBadReply) {
		t.Fatalf("notify reply not JSON: %v", err)
	}
}

func TestBackendOpen(t *testing.T) {
	for _, conn := range []string{"", "P2PHANDSHAKE", "p2phandshake"} {
		b, err := Open(conn, Options{})
		if err != nil {
			t.Fatalf("Open(%q): %v", conn, err)
		}
		b.Close()
	}
	for _, conn := range []string{"nosuch://x:1", "unknownscheme"} {
		if _, err := Open(conn, Options{}); !errors.Is(err, ErrUnknownServer) {
			t.Fatalf("Open(%q): %v, want ErrUnknownServer", conn, err)
		}
	}
	var gotConn string
	Register("crescent-test", func(conn string, opts Options) (Backend, error) {
		gotConn = conn
		return nil, os.ErrInvalid
	})
	if _, err := Open("crescent-test://h:1/x", Options{}); !errors.Is(err, os.ErrInvalid) || gotConn != "crescent-test://h:1/x" {
		t.Fatalf("registered backend not used: %v %q", err, gotConn)
	}
}

func TestP2PBackend(t *testing.T) {
	desc := testDesc("127.0.0.1:15005")
	s := startServer(t, ServerConfig{Handlers: Handlers{Metadata: func() *SegmentDesc { return desc }}})
	self := testDesc("127.0.0.1:15006")
	b, err := Open(P2PHandshake, Options{Timeout: wait, Self: func() *SegmentDesc { return self }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := b.Publish(ctx, self); err != nil {
		t.Fatal(err)
	}
	d, err := b.Get(ctx, s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != desc.Name || d.TCPDataPort != desc.TCPDataPort {
		t.Fatalf("got %+v", d)
	}
	if addr, err := b.RPCAddr(ctx, s.Addr()); err != nil || addr != s.Addr() {
		t.Fatalf("RPCAddr = %q, %v", addr, err)
	}
	for _, name := range []string{"", "nohost", "h:1:2"} {
		if _, err := b.Get(ctx, name); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%q): %v, want ErrNotFound", name, err)
		}
	}
	if err := b.Remove(ctx, self.Name); err != nil {
		t.Fatal(err)
	}
}

// TestP2PBackendTimeout: Get is bounded by Options.Timeout against a peer
// that accepts and never answers.
func TestP2PBackendTimeout(t *testing.T) {
	s := newScripted(t, stall)
	b, _ := Open(P2PHandshake, Options{Timeout: 100 * time.Millisecond})
	done := make(chan error, 1)
	go func() { _, err := b.Get(context.Background(), s.addr()); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
	case <-time.After(wait):
		t.Fatal("Get ignored its timeout")
	}
}
