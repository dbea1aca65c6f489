package shm_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
)

// A hand-written control-socket client, written from doc.go's protocol
// description rather than from the package's own types.

type ctlRegion struct {
	Addr uint64 `json:"addr"`
	Len  uint64 `json:"len"`
	FD   int    `json:"fd"`
	Off  int64  `json:"off"`
}

type ctlMsg struct {
	Op      string      `json:"op"`
	Version uint64      `json:"version"`
	Regions []ctlRegion `json:"regions"`
	More    bool        `json:"more"`
	ID      uint64      `json:"id"`
	Addr    uint64      `json:"addr"`
	Len     uint64      `json:"len"`
	Error   string      `json:"error"`
}

func rawDial(tb testing.TB, n *node) *net.UnixConn {
	tb.Helper()
	path := n.desc().Crescent.ShmSocket
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func rawSend(tb testing.TB, c *net.UnixConn, pkt []byte, fds []int) {
	tb.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(pkt, oob, nil); err != nil {
		tb.Fatalf("send: %v", err)
	}
}

// rawRecv returns the next packet and its fds, or nil once the server
// closed the connection.
func rawRecv(tb testing.TB, c *net.UnixConn) (*ctlMsg, []int) {
	tb.Helper()
	m, fds, err := recvPacket(c)
	if err != nil {
		tb.Fatal(err)
	}
	return m, fds
}

// recvPacket is rawRecv for goroutines other than the test's.
func recvPacket(c *net.UnixConn) (*ctlMsg, []int, error) {
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 128<<10)
	oob := make([]byte, unix.CmsgSpace(4*256))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, nil, errors.New("no packet and no close from the other side")
		}
		return nil, nil, nil
	}
	var fds []int
	if oobn > 0 {
		cms, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, nil, err
		}
		for _, cm := range cms {
			fs, err := unix.ParseUnixRights(&cm)
			if err != nil {
				closeFDs(fds)
				return nil, nil, err
			}
			fds = append(fds, fs...)
		}
	}
	if n == 0 {
		closeFDs(fds)
		return nil, nil, nil
	}
	m := &ctlMsg{}
	if err := json.Unmarshal(buf[:n], m); err != nil {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("bad packet %q: %w", buf[:n], err)
	}
	return m, fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// fakeTarget is a hand-written control socket playing the target.
type fakeTarget struct {
	ln   *net.UnixListener
	path string
}

var fakeSeq atomic.Int64

func newFakeTarget(tb testing.TB) *fakeTarget {
	tb.Helper()
	path := fmt.Sprintf("@crescent-test-fake/%d/%d", os.Getpid(), fakeSeq.Add(1))
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return &fakeTarget{ln: ln, path: path}
}

// peer is a descriptor of a same-host segment with one shareable buffer.
func (f *fakeTarget) peer(name string, addr, length uint64) transport.Peer {
	return &testPeer{name: name, desc: func() *metadata.SegmentDesc {
		return &metadata.SegmentDesc{Name: name, Protocol: "tcp",
			Buffers:  []metadata.Buffer{{Name: "cpu:0", Addr: addr, Length: length}},
			Crescent: &metadata.Extension{Version: 1, HostID: "same", ShmSocket: f.path, ShmBuffers: []uint64{addr}}}
	}}
}

func (f *fakeTarget) accept(tb testing.TB) *net.UnixConn {
	tb.Helper()
	f.ln.SetDeadline(time.Now().Add(20 * time.Second))
	c, err := f.ln.AcceptUnix()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// answerLists answers the peer's listings on c with reply(id) until it
// hangs up; the channel closes then.
func answerLists(c *net.UnixConn, reply func(id uint64) string) <-chan struct{} {
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			m, fds, err := recvPacket(c)
			closeFDs(fds)
			if m == nil || err != nil {
				return
			}
			if m.Op == "list" {
				c.Write([]byte(reply(m.ID)))
			}
		}
	}()
	return served
}
