package metadata

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/crescent-kv/crescent/internal/auth"
)

var (
	ErrRejected      = errors.New("metadata: peer rejected the request")
	ErrBadReply      = errors.New("metadata: malformed reply")
	ErrNoDescriptor  = errors.New("metadata: peer has no segment descriptor")
	ErrNotFound      = errors.New("metadata: segment not found")
	ErrUnknownServer = errors.New("metadata: unsupported metadata connection string")
	// ErrUnreachable: no connection to the peer's handshake server.
	ErrUnreachable = errors.New("metadata: handshake server unreachable")
	// ErrNoReply: connected, but the handshake server sent no reply (it
	// timed out, or closed the connection at its connection limits).
	ErrNoReply = errors.New("metadata: handshake server did not answer")
)

// DefaultReplyMax bounds reply frames a client accepts. Descriptors of
// segments with many buffers can exceed the request limit.
const DefaultReplyMax = 64 << 20

func putLen(b []byte, n uint64) { binary.LittleEndian.PutUint64(b, n) }

// Client is the handshake's dialling side. The zero value speaks the
// reference protocol; with Token set, every connection first passes
// auth.Client (PurposeHandshake), as a server with a Token requires.
type Client struct {
	Token []byte
}

// Exchange sends one frame to addr and returns the reply body, on a new
// connection closed afterwards. ctx bounds the whole exchange.
func Exchange(ctx context.Context, addr string, t MsgType, body []byte) ([]byte, error) {
	return Client{}.Exchange(ctx, addr, t, body)
}

// Exchange is the package's Exchange, authenticated when cl.Token is set.
func (cl Client) Exchange(ctx context.Context, addr string, t MsgType, body []byte) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
	}
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	c, err := d.DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, addr, ctxErr(ctx, err))
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if cl.Token != nil {
		if err := auth.Client(c, cl.Token, auth.PurposeHandshake, time.Until(dl)); err != nil {
			return nil, fmt.Errorf("metadata: %s: %w", addr, ctxErr(ctx, err))
		}
		c.SetDeadline(dl) // auth.Client cleared it
	}
	if err := WriteFrame(c, t, body); err != nil {
		return nil, exchangeErr(ctx, addr, t, "send", err)
	}
	rt, reply, err := ReadFrame(c, DefaultReplyMax)
	if err != nil {
		return nil, exchangeErr(ctx, addr, t, "reply", err)
	}
	if rt != t {
		return nil, fmt.Errorf("%w: %v reply has type %v", ErrBadReply, t, rt)
	}
	if msg := replyError(reply); msg != "" {
		return nil, fmt.Errorf("%w: %s: %s", ErrRejected, addr, msg)
	}
	return reply, nil
}

// exchangeErr says why an exchange on an open connection failed: the
// deadline passed without a reply, or the server hung up.
func exchangeErr(ctx context.Context, addr string, t MsgType, stage string, err error) error {
	err = ctxErr(ctx, err)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %s: connected, but no %v reply before the deadline (server overloaded, or not a handshake server): %w", ErrNoReply, addr, t, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return fmt.Errorf("%w: %s closed the connection before its %v reply (at its connection limits?): %w", ErrNoReply, addr, t, err)
	}
	return fmt.Errorf("metadata: %v %s %s: %w", t, stage, addr, err)
}

// ctxErr reports an I/O error caused by ctx as ctx's error. The socket
// deadline is ctx's deadline and may fire before ctx's own timer does.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) && errors.As(err, &ne) && ne.Timeout() {
		return context.DeadlineExceeded
	}
	return err
}

// replyError extracts the error of an error reply ({"status":"error"} or
// a non-empty "reply_msg" with no other content).
func replyError(b []byte) string {
	var r struct {
		Status   string `json:"status"`
		ReplyMsg string `json:"reply_msg"`
	}
	if json.Unmarshal(b, &r) != nil {
		return ""
	}
	if r.Status == "error" {
		if r.ReplyMsg == "" {
			return "error"
		}
		return r.ReplyMsg
	}
	return ""
}

// FetchDesc asks the handshake server at addr for its segment descriptor.
// self is sent as the request body, as reference peers expect; nil sends
// an empty object.
func FetchDesc(ctx context.Context, addr string, self *SegmentDesc) (*SegmentDesc, error) {
	return Client{}.FetchDesc(ctx, addr, self)
}

// FetchDesc is the package's FetchDesc over cl.
func (cl Client) FetchDesc(ctx context.Context, addr string, self *SegmentDesc) (*SegmentDesc, error) {
	body := []byte("{}\n")
	if self != nil {
		b, err := self.Marshal()
		if err != nil {
			return nil, err
		}
		body = b
	}
	reply, err := cl.Exchange(ctx, addr, Metadata, body)
	if err != nil {
		return nil, err
	}
	if string(trimSpace(reply)) == "null" {
		return nil, fmt.Errorf("%w: %s", ErrNoDescriptor, addr)
	}
	return UnmarshalDesc(reply)
}

// SendNotify delivers a notification to the handshake server at addr.
func SendNotify(ctx context.Context, addr, from, msg string) error {
	return Client{}.SendNotify(ctx, addr, from, msg)
}

// SendNotify is the package's SendNotify over cl.
func (cl Client) SendNotify(ctx context.Context, addr, from, msg string) error {
	body, _ := json.Marshal(NotifyMsg{Name: from, NotifyMsg: msg})
	reply, err := cl.Exchange(ctx, addr, Notify, append(body, '\n'))
	if err != nil {
		return err
	}
	var r NotifyMsg
	if err := json.Unmarshal(reply, &r); err != nil {
		return fmt.Errorf("%w: notify: %w", ErrBadReply, err)
	}
	if r.NotifyMsg == "" {
		return fmt.Errorf("%w: notify not accepted by %s", ErrRejected, addr)
	}
	return nil
}

// SendProbe checks that a handshake server answers at addr.
func SendProbe(ctx context.Context, addr string) error {
	return Client{}.SendProbe(ctx, addr)
}

// SendProbe is the package's SendProbe over cl.
func (cl Client) SendProbe(ctx context.Context, addr string) error {
	reply, err := cl.Exchange(ctx, addr, Probe, []byte("{}\n"))
	if err != nil {
		return err
	}
	var r struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(reply, &r); err != nil || r.Status != "success" {
		return fmt.Errorf("%w: probe reply %q", ErrBadReply, trimSpace(reply))
	}
	return nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
