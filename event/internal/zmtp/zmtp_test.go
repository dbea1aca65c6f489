package zmtp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func reader(b []byte) *Conn { return &Conn{br: bufio.NewReader(bytes.NewReader(b))} }

func TestReadMsg(t *testing.T) {
	long := bytes.Repeat([]byte{7}, 300)
	var in []byte
	in = append(in, 0x04, 5, 4, 'P', 'I', 'N', 'G') // a command: skipped
	in = AppendMsg(in, []byte("topic"), []byte{}, long)
	in = AppendMsg(in, []byte("x"))
	c := reader(in)
	msg, err := c.ReadMsg()
	if err != nil {
		t.Fatal(err)
	}
	if len(msg) != 3 || string(msg[0]) != "topic" || len(msg[1]) != 0 || !bytes.Equal(msg[2], long) {
		t.Fatalf("got %q", msg)
	}
	if msg, err = c.ReadMsg(); err != nil || len(msg) != 1 || string(msg[0]) != "x" {
		t.Fatalf("got %q, %v", msg, err)
	}
	if _, err = c.ReadMsg(); err != io.EOF {
		t.Fatalf("at end: %v", err)
	}
	// The long-frame header of AppendMsg is the ZMTP one: flag 0x02, 8-byte size.
	if h := AppendHeader(nil, 300, true); !bytes.Equal(h, []byte{0x03, 0, 0, 0, 0, 0, 0, 1, 44}) {
		t.Fatalf("header %x", h)
	}
}

func TestReadMsgErrors(t *testing.T) {
	for name, in := range map[string][]byte{
		"truncated body":   {0x00, 5, 'a'},
		"truncated size":   {0x02, 0, 0},
		"more then EOF":    {0x01, 1, 'a'},
		"oversized frame":  {0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"just over limit":  {0x02, 0, 0, 0, 0, 0x10, 0, 0, 1},
		"flag without len": {0x00},
	} {
		_, err := reader(in).ReadMsg()
		if err == nil || err == io.EOF {
			t.Errorf("%s: err = %v", name, err)
		}
		if name == "oversized frame" && !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]Endpoint{
		"tcp://*:5557":         {Raw: "tcp://*:5557", Scheme: "tcp", Network: "tcp", Addr: ":5557"},
		"tcp://[::]:1":         {Raw: "tcp://[::]:1", Scheme: "tcp", Network: "tcp", Addr: "[::]:1"},
		"tcp://127.0.0.1:0":    {Raw: "tcp://127.0.0.1:0", Scheme: "tcp", Network: "tcp", Addr: "127.0.0.1:0"},
		"ipc:///run/kv.sock":   {Raw: "ipc:///run/kv.sock", Scheme: "ipc", Network: "unix", Addr: "/run/kv.sock"},
		"tcp://indexer.ns:555": {Raw: "tcp://indexer.ns:555", Scheme: "tcp", Network: "tcp", Addr: "indexer.ns:555"},
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "tcp://", "tcp://host", "inproc://a", "pgm://x:1", "ipc://"} {
		if _, err := Parse(in); !errors.Is(err, ErrEndpoint) {
			t.Errorf("Parse(%q) = %v", in, err)
		}
	}
}

func FuzzReadMsg(f *testing.F) {
	f.Add(AppendMsg(nil, []byte("t"), make([]byte, 8), bytes.Repeat([]byte{1}, 300)))
	f.Add([]byte{0x04, 1, 0, 0x00, 0})
	f.Add([]byte{0x02, 0xff, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		c := reader(in)
		for range 64 {
			msg, err := c.ReadMsg()
			if err != nil {
				return
			}
			total := 0
			for _, fr := range msg {
				total += len(fr)
			}
			if total > len(in) {
				t.Fatalf("message of %d bytes from %d input bytes", total, len(in))
			}
		}
	})
}
