package metadata

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// wait is the bound for "eventually" conditions; generous for a loaded
// 2-core machine.
const wait = 20 * time.Second

func startServer(t testing.TB, cfg ServerConfig) *Server {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// rawExchange dials addr, writes in, half-closes, and returns every byte
// the server sent until it closed. A reset after some bytes is reported
// with the bytes read so far.
func rawExchange(addr string, in []byte) ([]byte, error) {
	c, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	if len(in) > 0 {
		if _, err := c.Write(in); err != nil {
			return nil, err
		}
	}
	c.(*net.TCPConn).CloseWrite()
	return io.ReadAll(c)
}

// reply is a decoded server answer.
type reply struct {
	typed bool
	t     MsgType
	body  []byte
}

// parseReply decodes a whole server answer the way the reference's
// readString does: length, then a type byte if the first payload byte is
// a known type, else an untyped payload.
func parseReply(b []byte) (reply, error) {
	if len(b) < 8 {
		return reply{}, fmt.Errorf("short reply (%d bytes): %q", len(b), b)
	}
	n := binary.LittleEndian.Uint64(b)
	if n != uint64(len(b)-8) || n == 0 {
		return reply{}, fmt.Errorf("length field %d, payload %d bytes: %q", n, len(b)-8, b)
	}
	p := b[8:]
	if p[0] <= byte(Probe) {
		return reply{typed: true, t: MsgType(p[0]), body: p[1:]}, nil
	}
	return reply{body: p}, nil
}

func isErrorReply(body []byte) bool {
	var r struct {
		Status   string `json:"status"`
		ReplyMsg string `json:"reply_msg"`
	}
	return json.Unmarshal(body, &r) == nil && r.Status == "error" && r.ReplyMsg != ""
}

func testDesc(name string) *SegmentDesc {
	return &SegmentDesc{Name: name, Protocol: "tcp", TCPDataPort: 16001, TCPProtoVersion: 2, TCPDataHost: "127.0.0.1",
		Timestamp: "2026-07-01 12:34:56.123456", Buffers: []Buffer{{Name: "cpu:0", Addr: 0x7f00_0000_0000, Length: 1 << 20}}}
}

type notifyLog struct {
	mu  sync.Mutex
	got []NotifyMsg
}

func (l *notifyLog) add(from, msg string) {
	l.mu.Lock()
	l.got = append(l.got, NotifyMsg{Name: from, NotifyMsg: msg})
	l.mu.Unlock()
}

func (l *notifyLog) all() []NotifyMsg {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]NotifyMsg(nil), l.got...)
}

func TestServerAnswers(t *testing.T) {
	desc := testDesc("127.0.0.1:15001")
	descJSON, _ := desc.Marshal()
	connHandler := func(req json.RawMessage) (json.RawMessage, error) {
		var r struct {
			QP []int `json:"qp_num"`
		}
		if err := json.Unmarshal(req, &r); err != nil {
			return nil, err
		}
		if len(r.QP) == 0 {
			return nil, errors.New("no qp numbers")
		}
		return json.RawMessage(fmt.Sprintf(`{"qp_num":[%d],"reply_msg":""}`, r.QP[0]+100)), nil
	}
	full := Handlers{Metadata: func() *SegmentDesc { return desc }, Connection: connHandler}
	cases := []struct {
		name     string
		h        Handlers
		req      []byte
		typed    bool
		wantType MsgType
		want     string // exact body; "" = an error reply
		notifies []NotifyMsg
	}{
		{"metadata with peer descriptor", full, frameBytes(Metadata, string(descJSON)), true, Metadata, string(descJSON), nil},
		{"metadata with empty object", full, frameBytes(Metadata, "{}\n"), true, Metadata, string(descJSON), nil},
		{"metadata, descriptor not ready", Handlers{Metadata: func() *SegmentDesc { return nil }}, frameBytes(Metadata, "{}"), true, Metadata, "null\n", nil},
		{"metadata without handler", Handlers{}, frameBytes(Metadata, "{}"), true, Metadata, "", nil},
		{"notify", full, frameBytes(Notify, `{"name":"10.0.0.9:15010","notify_msg":"batch 7 done"}`+"\n"), true, Notify,
			`{"name":"","notify_msg":"success"}` + "\n", []NotifyMsg{{"10.0.0.9:15010", "batch 7 done"}}},
		{"notify, extra fields", full, frameBytes(Notify, `{"name":"a","notify_msg":"m","x":[1]}`), true, Notify,
			`{"name":"","notify_msg":"success"}` + "\n", []NotifyMsg{{"a", "m"}}},
		{"notify, wrong shape", full, frameBytes(Notify, `{"name":5}`), true, Notify, "", nil},
		{"notify, array", full, frameBytes(Notify, `[1,2]`), true, Notify, "", nil},
		{"notify without handler", Handlers{}, frameBytes(Notify, `{"name":"a","notify_msg":"m"}`), true, Notify,
			`{"name":"","notify_msg":""}` + "\n", nil},
		{"probe", Handlers{}, frameBytes(Probe, "{}\n"), true, Probe, `{"status":"success"}` + "\n", nil},
		{"probe with a body", full, frameBytes(Probe, `{"x":1}`), true, Probe, `{"status":"success"}` + "\n", nil},
		{"connection", full, frameBytes(Connection, `{"qp_num":[5,6],"local_nic_path":"h@mlx5_0"}`), true, Connection,
			`{"qp_num":[105],"reply_msg":""}` + "\n", nil},
		{"connection, handler error", full, frameBytes(Connection, `{"qp_num":[]}`), true, Connection, "", nil},
		{"connection without handler", Handlers{}, frameBytes(Connection, `{"qp_num":[1]}`), true, Connection, "", nil},
		{"legacy untyped connection", full,
			append(binary.LittleEndian.AppendUint64(nil, 13), `{"qp_num":[1]}`[:13]...), false, 0, "", nil},
		{"legacy untyped connection, valid", full,
			append(binary.LittleEndian.AppendUint64(nil, 14), `{"qp_num":[1]}`...), false, 0, `{"qp_num":[101],"reply_msg":""}` + "\n", nil},
		{"legacy untyped without handler", Handlers{},
			append(binary.LittleEndian.AppendUint64(nil, 14), `{"qp_num":[1]}`...), false, 0, "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var log notifyLog
			h := tc.h
			if h.Metadata != nil || h.Connection != nil {
				h.Notify = log.add
			}
			s := startServer(t, ServerConfig{Handlers: h})
			out, err := rawExchange(s.Addr(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			r, err := parseReply(out)
			if err != nil {
				t.Fatal(err)
			}
			if r.typed != tc.typed || (tc.typed && r.t != tc.wantType) {
				t.Fatalf("reply typed=%v type=%v, want typed=%v type=%v", r.typed, r.t, tc.typed, tc.wantType)
			}
			if tc.want == "" {
				if !isErrorReply(r.body) {
					t.Fatalf("want an error reply, got %q", r.body)
				}
			} else if string(r.body) != tc.want {
				t.Fatalf("body = %q\nwant   %q", r.body, tc.want)
			}
			if got := log.all(); fmt.Sprint(got) != fmt.Sprint(tc.notifies) {
				t.Fatalf("notifies = %v, want %v", got, tc.notifies)
			}
		})
	}
}

// TestServerBadInput: every kind of bad request gets an error reply or a
// clean close, and the server keeps answering others.
func TestServerBadInput(t *testing.T) {
	le := func(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }
	cases := []struct {
		name string
		in   []byte
		// untyped: the reply carries no type byte (unknown type bytes
		// are read as the reference's untyped old protocol).
		untyped bool
		// mayReset: bytes the server never reads follow the frame, so
		// the kernel may reset the connection before the reply is read.
		mayReset bool
	}{
		{name: "zero length", in: le(0)},
		{name: "oversize length", in: le(DefaultMaxFrame + 1)},
		{name: "huge length", in: le(1 << 62)},
		{name: "oversize with body", in: append(le(DefaultMaxFrame+1), 1, '{', '}'), mayReset: true},
		{name: "truncated length", in: []byte{5, 0, 0}},
		{name: "truncated body", in: append(le(100), 1, '{', '"')},
		{name: "length only", in: le(50)},
		{name: "invalid json", in: frameBytes(Metadata, `{"name":`)},
		{name: "not json", in: frameBytes(Probe, "\x00\x01\x02")},
		{name: "empty body", in: frameBytes(Notify, "")},
		{name: "unknown type 4", in: frameBytes(4, "{}"), untyped: true},
		{name: "unknown type 0x7a", in: frameBytes(0x7a, "{}"), untyped: true},
		{name: "unknown type 0x80", in: frameBytes(0x80, "{}"), untyped: true},
		{name: "unknown type 0xff", in: frameBytes(0xff, "{}"), untyped: true},
		{name: "legacy invalid json", in: append(le(3), `{"a`...), untyped: true},
		{name: "http request", in: []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), mayReset: true},
		{name: "tls hello", in: []byte{0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03}, mayReset: true},
	}
	s := startServer(t, ServerConfig{Handlers: Handlers{Metadata: func() *SegmentDesc { return testDesc("h:1") }}})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := rawExchange(s.Addr(), tc.in)
			switch {
			case err != nil && tc.mayReset && errors.Is(err, syscall.ECONNRESET):
				// Closed: acceptable, as the reference closes too.
			case err != nil:
				t.Fatalf("exchange: %v (got %q)", err, out)
			default:
				r, err := parseReply(out)
				if err != nil {
					t.Fatal(err)
				}
				if r.typed == tc.untyped {
					t.Fatalf("reply typed=%v, want typed=%v", r.typed, !tc.untyped)
				}
				if !isErrorReply(r.body) {
					t.Fatalf("want an error reply, got %q", r.body)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if err := SendProbe(ctx, s.Addr()); err != nil {
				t.Fatalf("server stopped answering: %v", err)
			}
		})
	}
	t.Run("connect and leave", func(t *testing.T) {
		out, err := rawExchange(s.Addr(), nil)
		if err != nil || len(out) != 0 {
			t.Fatalf("got %q, %v; want a silent close", out, err)
		}
	})
}

// TestServerSilentClients: clients that connect and never send (or send
// a byte at a time) hold a slot only until the exchange timeout, so with
// every slot taken by them the server still answers others.
func TestServerSilentClients(t *testing.T) {
	const timeout = 300 * time.Millisecond
	s := startServer(t, ServerConfig{Timeout: timeout, MaxConns: 2})
	var silent []net.Conn
	for range 4 {
		c, err := net.DialTimeout("tcp", s.Addr(), wait)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		silent = append(silent, c)
	}
	// A trickling client: a valid frame, one byte at a time.
	trickle, err := net.DialTimeout("tcp", s.Addr(), wait)
	if err != nil {
		t.Fatal(err)
	}
	defer trickle.Close()
	stop := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		for _, b := range frameBytes(Probe, "{}"+strings.Repeat(" ", 200)) {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := trickle.Write([]byte{b}); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); <-trickled }()

	// Slots are held by stalled clients; a real request must still be
	// answered once their exchanges time out.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for range 3 {
		if err := SendProbe(ctx, s.Addr()); err != nil {
			t.Fatalf("probe behind silent clients: %v", err)
		}
	}
	// Each stalled client is closed (possibly after an error reply: the
	// write deadline has passed too, so the server may not send one).
	for i, c := range append(silent, trickle) {
		c.SetReadDeadline(time.Now().Add(wait))
		out, err := io.ReadAll(c)
		if err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("client %d: %v (server never closed it)", i, err)
		}
		if err == nil && len(out) > 0 {
			r, perr := parseReply(out)
			if perr != nil || !isErrorReply(r.body) {
				t.Fatalf("client %d: got %q (%v), want a timeout error reply", i, out, perr)
			}
		}
	}
}

func TestServerConcurrentClients(t *testing.T) {
	var log notifyLog
	desc := testDesc("127.0.0.1:15002")
	s := startServer(t, ServerConfig{MaxConns: 8, Handlers: Handlers{Metadata: func() *SegmentDesc { return desc }, Notify: log.add}})
	const clients, rounds = 32, 8
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range rounds {
				var err error
				switch j % 3 {
				case 0:
					err = SendProbe(ctx, s.Addr())
				case 1:
					err = SendNotify(ctx, s.Addr(), fmt.Sprintf("c%d", i), fmt.Sprintf("m%d", j))
				case 2:
					var d *SegmentDesc
					d, err = FetchDesc(ctx, s.Addr(), testDesc(fmt.Sprintf("127.0.0.1:%d", 20000+i)))
					if err == nil && d.Name != desc.Name {
						err = fmt.Errorf("got descriptor %q", d.Name)
					}
				}
				if err != nil {
					errs <- fmt.Errorf("client %d round %d: %w", i, j, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got := map[string]bool{}
	for _, n := range log.all() {
		got[n.Name+"/"+n.NotifyMsg] = true
	}
	want := 0
	for i := range clients {
		for j := range rounds {
			if j%3 == 1 {
				want++
				if !got[fmt.Sprintf("c%d/m%d", i, j)] {
					t.Errorf("notify c%d/m%d lost", i, j)
				}
			}
		}
	}
	if n := len(log.all()); n != want {
		t.Errorf("%d notifies, want %d", n, want)
	}
}

// TestServerCloseWithStalledClients: Close does not wait for the exchange
// timeout of clients that never send.
func TestServerCloseWithStalledClients(t *testing.T) {
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0", Timeout: time.Hour, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	for range 3 { // two exchanges and one waiting in the accept queue
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("Close blocked on stalled clients")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := SendProbe(ctx, addr); err == nil {
		t.Fatal("probe answered after Close")
	}
}

func TestServerHandleConnection(t *testing.T) {
	s := startServer(t, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := Exchange(ctx, s.Addr(), Connection, []byte(`{"a":1}`)); !errors.Is(err, ErrRejected) {
		t.Fatalf("before a handler: %v, want ErrRejected", err)
	}
	var got string
	s.HandleConnection(func(req json.RawMessage) (json.RawMessage, error) {
		got = string(req)
		return json.RawMessage(`{"reply_msg":"","ok":true}`), nil
	})
	out, err := Exchange(ctx, s.Addr(), Connection, []byte(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"reply_msg":"","ok":true}`+"\n" || got != `{"a":1}` {
		t.Fatalf("reply %q, handler saw %q", out, got)
	}
}

// TestServerNoFDLeak: good, bad and stalled exchanges, then Close, leave
// no descriptor open.
func TestServerNoFDLeak(t *testing.T) {
	noFDLeak(t)
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0", Timeout: 200 * time.Millisecond,
		Handlers: Handlers{Metadata: func() *SegmentDesc { return testDesc("h:1") }}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for range 10 {
		if _, err := FetchDesc(ctx, s.Addr(), nil); err != nil {
			t.Fatal(err)
		}
		rawExchange(s.Addr(), binary.LittleEndian.AppendUint64(nil, 0))
		rawExchange(s.Addr(), frameBytes(0x42, "{"))
		rawExchange(s.Addr(), nil)
	}
	stalled, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
}

func TestNewServerListenError(t *testing.T) {
	s := startServer(t, ServerConfig{})
	if _, err := NewServer(ServerConfig{Addr: s.Addr()}); err == nil {
		t.Fatal("second server on the same port")
	}
}

// FuzzServerExchange feeds arbitrary bytes to a live server: it must
// answer with a well-formed frame or close, and keep serving.
func FuzzServerExchange(f *testing.F) {
	f.Add(frameBytes(Metadata, `{"name":"segment"}`))
	f.Add(frameBytes(Notify, `{"name":"a","notify_msg":"b"}`+"\n"))
	f.Add(frameBytes(Probe, "{}\n"))
	f.Add(frameBytes(Connection, `{"qp_num":[1]}`))
	f.Add(append(binary.LittleEndian.AppendUint64(nil, 7), `{"a":1}`...))
	f.Add(binary.LittleEndian.AppendUint64(nil, 0))
	f.Add(binary.LittleEndian.AppendUint64(nil, DefaultMaxFrame+1))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add(frameBytes(9, "{}"))
	f.Add([]byte{})
	var log notifyLog
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0", MaxFrame: 4096, Timeout: 5 * time.Second,
		Handlers: Handlers{Metadata: func() *SegmentDesc { return testDesc("h:1") }, Notify: log.add,
			Connection: func(req json.RawMessage) (json.RawMessage, error) { return req, nil }}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := rawExchange(s.Addr(), in)
		if err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("exchange: %v", err)
		}
		if err == nil && len(out) > 0 {
			r, perr := parseReply(out)
			if perr != nil {
				t.Fatalf("malformed reply: %v", perr)
			}
			if !json.Valid(r.body) || !bytes.HasSuffix(r.body, []byte("\n")) {
				t.Fatalf("reply body %q", r.body)
			}
		}
		if err == nil && len(out) == 0 && len(in) != 0 {
			t.Fatalf("silent close after %d bytes", len(in))
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := SendProbe(ctx, s.Addr()); err != nil {
			t.Fatalf("server stopped answering: %v", err)
		}
	})
}
