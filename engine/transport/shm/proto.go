package shm

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Messages on the control socket (SOCK_SEQPACKET: one JSON object per
// packet, memfds attached as SCM_RIGHTS to "regions" packets).
type message struct {
	Op string `json:"op"` // list | regions | revoke | revoked | error
	// regions
	Version uint64   `json:"version,omitempty"`
	Regions []region `json:"regions,omitempty"`
	More    bool     `json:"more,omitempty"`
	// revoke / revoked
	ID   uint64 `json:"id,omitempty"`
	Addr uint64 `json:"addr,omitempty"`
	Len  uint64 `json:"len,omitempty"`
	// error
	Error string `json:"error,omitempty"`
}

// region is a shareable registered buffer: bytes [Off, Off+Len) of the
// memfd attached at index FD map the target's [Addr, Addr+Len).
type region struct {
	Addr uint64 `json:"addr"`
	Len  uint64 `json:"len"`
	FD   int    `json:"fd"`
	Off  int64  `json:"off"`
}

const (
	maxPacket = 64 << 10
	// maxFDs stays below the kernel's SCM_MAX_FD (253).
	maxFDs = 200
)

var errBadMessage = errors.New("shm: malformed control message")

func send(c *net.UnixConn, m *message, fds []int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > maxPacket {
		return fmt.Errorf("shm: control message of %d bytes too large", len(b))
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

// recv reads one packet and the fds attached to it. The caller owns (and
// must close) the fds.
func recv(c *net.UnixConn, buf, oob []byte) (*message, []int, error) {
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", errBadMessage, err)
		}
		for _, cm := range msgs {
			fs, err := unix.ParseUnixRights(&cm)
			if err == nil {
				fds = append(fds, fs...)
			}
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeAll(fds)
		return nil, nil, fmt.Errorf("%w: truncated packet", errBadMessage)
	}
	if n == 0 {
		closeAll(fds)
		return nil, nil, net.ErrClosed
	}
	m := &message{}
	if err := json.Unmarshal(buf[:n], m); err != nil {
		closeAll(fds)
		return nil, nil, fmt.Errorf("%w: %w", errBadMessage, err)
	}
	return m, fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// packets adapts a SOCK_SEQPACKET connection to auth's exact-length
// reads: each challenge message is one packet, so a Read that gets fewer
// bytes than asked (a control message where a hello belongs) fails at
// once instead of waiting for more packets.
type packets struct{ *net.UnixConn }

var errShortPacket = errors.New("shm: packet shorter than the authentication message")

func (p packets) Read(b []byte) (int, error) {
	n, err := p.UnixConn.Read(b)
	if err == nil && n < len(b) {
		err = errShortPacket
	}
	return n, err
}
