package metadata

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/netx"
)

// NotifyMsg is the body of a Notify frame.
type NotifyMsg struct {
	Name      string `json:"name"`
	NotifyMsg string `json:"notify_msg"`
}

// Handlers answer handshake requests. Nil handlers make the server reply
// with an error.
type Handlers struct {
	// Metadata returns the local segment descriptor.
	Metadata func() *SegmentDesc
	// Notify receives a notification from segment `from`.
	Notify func(from, msg string)
	// Connection answers a transport endpoint handshake (RDMA, EFA). It
	// returns the reply JSON; a failure is reported to the peer in
	// "reply_msg".
	Connection func(req json.RawMessage) (json.RawMessage, error)
}

// ServerConfig configures a handshake Server.
type ServerConfig struct {
	Addr     string // host:port to listen on
	Handlers Handlers
	// MaxFrame bounds request frames (default DefaultMaxFrame).
	MaxFrame int
	// Timeout bounds each exchange (default 5s).
	Timeout time.Duration
	// FirstByteTimeout closes a connection that sends nothing for this
	// long after connecting (default 1s, at most Timeout).
	FirstByteTimeout time.Duration
	// MaxConns caps live connections (default 1024; negative: no cap).
	// At the cap the connection idle longest (nothing sent yet, or its
	// reply already sent) is closed to make room; when every one is
	// mid-exchange, new peers wait in the accept queue.
	MaxConns int
	// MaxConnsPerHost caps live connections from one IP (default 256;
	// negative: no cap). At the cap that host's idlest connection is
	// closed, or the new one is refused when none is idle.
	MaxConnsPerHost int
	// Token, when set, makes every connection pass auth.Server
	// (PurposeHandshake) before its frame is read; one that fails is
	// closed without a reply.
	Token []byte
	// Allow, when set, admits peers by address (netx.Config.Allow: the
	// protected default passes auth.LoopbackOnly).
	Allow func(net.Addr) bool
	// Logger: nil = slog.Default(), so the application's slog setup applies.
	Logger *slog.Logger
}

// Server answers the P2P handshake: one request frame and one reply frame
// per TCP connection, as the reference does.
type Server struct {
	cfg  ServerConfig
	loop *netx.Loop

	mu     sync.Mutex
	conn   func(json.RawMessage) (json.RawMessage, error)
	byProt map[string]func(json.RawMessage) (json.RawMessage, error)
}

// NewServer listens on cfg.Addr and starts serving.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.FirstByteTimeout <= 0 {
		cfg.FirstByteTimeout = time.Second
	}
	cfg.FirstByteTimeout = min(cfg.FirstByteTimeout, cfg.Timeout)
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 1024
	}
	if cfg.MaxConnsPerHost == 0 {
		cfg.MaxConnsPerHost = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, conn: cfg.Handlers.Connection}
	s.loop = netx.Serve(ln, netx.Config{MaxConns: cfg.MaxConns, MaxConnsPerHost: cfg.MaxConnsPerHost,
		IdleGrace: cfg.FirstByteTimeout / 4, Name: "handshake server", Logger: cfg.Logger, Allow: cfg.Allow}, s.exchange)
	return s, nil
}

// Addr is the listening address (host:port).
func (s *Server) Addr() string { return s.loop.Addr().String() }

// HandleConnection installs the default Connection handler: the one for
// requests without a "protocol" field (the reference's RDMA handshake).
func (s *Server) HandleConnection(h func(json.RawMessage) (json.RawMessage, error)) {
	s.mu.Lock()
	s.conn = h
	s.mu.Unlock()
}

// HandleProtocol installs the Connection handler for requests whose
// "protocol" field is p (the reference routes handshakes so). Transports
// that exchange endpoint information (rdma, efa) call it when they start;
// nil removes it.
func (s *Server) HandleProtocol(p string, h func(json.RawMessage) (json.RawMessage, error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byProt == nil {
		s.byProt = make(map[string]func(json.RawMessage) (json.RawMessage, error))
	}
	if h == nil {
		delete(s.byProt, p)
		return
	}
	s.byProt[p] = h
}

// errorReply is what a malformed or refused request gets back.
type errorReply struct {
	Status   string `json:"status"`
	ReplyMsg string `json:"reply_msg"`
}

// exchange serves one connection. It is idle (evictable at a cap) until
// its first byte arrives and again once the reply is sent.
func (s *Server) exchange(c *netx.Conn) {
	start := time.Now()
	c.SetDeadline(start.Add(s.cfg.FirstByteTimeout))
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return // sent nothing: a port probe, a health check, or a squatter
	}
	c.Busy()
	var r io.Reader = io.MultiReader(bytes.NewReader(first[:]), c)
	if s.cfg.Token != nil {
		// The first byte belongs to the hello; nothing is served before
		// the peer proved the token.
		if err := auth.Server(&prefixConn{Conn: c, r: r}, s.cfg.Token, auth.PurposeHandshake, s.cfg.Timeout); err != nil {
			s.cfg.Logger.Debug("handshake: peer failed authentication", "peer", c.RemoteAddr(), "err", err)
			return
		}
		r = c
	}
	c.SetDeadline(start.Add(s.cfg.Timeout))
	t, body, err := ReadFrame(r, s.cfg.MaxFrame)
	legacy := false
	if err == nil && t > Probe {
		// A frame without a type byte (first byte '{') is the reference's
		// old protocol: a Connection request answered without type byte.
		legacy = true
		body = append([]byte{byte(t)}, body...)
		t = Connection
	}
	var reply any
	switch {
	case err != nil:
		s.cfg.Logger.Debug("handshake: bad frame", "peer", c.RemoteAddr(), "err", err)
		reply = errorReply{Status: "error", ReplyMsg: err.Error()}
	case !json.Valid(body):
		reply = errorReply{Status: "error", ReplyMsg: "malformed json"}
	default:
		reply = s.handle(t, body)
	}
	out, err := json.Marshal(reply)
	if err != nil {
		out, _ = json.Marshal(errorReply{Status: "error", ReplyMsg: err.Error()})
	}
	out = append(out, '\n')
	if legacy {
		var hdr [8]byte
		putLen(hdr[:], uint64(len(out)))
		if _, err := c.Write(append(hdr[:], out...)); err != nil {
			return
		}
	} else if err := WriteFrame(c, t, out); err != nil {
		return
	}
	// Half-close and let the client close first, as the reference does,
	// so the reply is never cut by a reset.
	c.Idle()
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	c.Read(first[:])
}

// prefixConn reads from r (bytes already taken off the connection, then
// the connection) and writes to the connection.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (p *prefixConn) Read(b []byte) (int, error) { return p.r.Read(b) }

func (s *Server) handle(t MsgType, body []byte) any {
	h := s.cfg.Handlers
	switch t {
	case Metadata:
		// The request carries the caller's own descriptor; the reference
		// ignores it, and so do we.
		if h.Metadata == nil {
			return errorReply{Status: "error", ReplyMsg: "no segment descriptor"}
		}
		d := h.Metadata()
		if d == nil {
			return nil
		}
		return d
	case Notify:
		var n NotifyMsg
		if err := json.Unmarshal(body, &n); err != nil {
			return errorReply{Status: "error", ReplyMsg: "malformed notify: " + err.Error()}
		}
		if h.Notify == nil {
			return NotifyMsg{}
		}
		h.Notify(n.Name, n.NotifyMsg)
		return NotifyMsg{Name: "", NotifyMsg: "success"}
	case Probe:
		return map[string]string{"status": "success"}
	case Connection:
		var sel struct {
			Protocol string `json:"protocol"`
		}
		json.Unmarshal(body, &sel)
		s.mu.Lock()
		conn := s.conn
		if sel.Protocol != "" {
			conn = s.byProt[sel.Protocol]
		}
		s.mu.Unlock()
		if conn == nil {
			if sel.Protocol != "" {
				return errorReply{Status: "error", ReplyMsg: "Unsupported handshake protocol: " + sel.Protocol}
			}
			return errorReply{Status: "error", ReplyMsg: "No default handshake handler is registered"}
		}
		out, err := conn(body)
		if err != nil {
			return errorReply{Status: "error", ReplyMsg: err.Error()}
		}
		return out
	}
	return errorReply{Status: "error", ReplyMsg: fmt.Sprintf("unexpected handshake message type %d", t)}
}

// Close stops the server: it closes every connection and waits for the
// exchanges to return.
func (s *Server) Close() error { return s.loop.Close() }
