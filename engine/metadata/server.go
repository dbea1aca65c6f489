package metadata

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
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
	// MaxConns bounds concurrent exchanges (default 128); more wait in the
	// accept queue.
	MaxConns int
	Logger   *slog.Logger
}

// Server answers the P2P handshake: one request frame and one reply frame
// per TCP connection, as the reference does.
type Server struct {
	cfg ServerConfig
	ln  net.Listener

	mu     sync.Mutex
	conn   func(json.RawMessage) (json.RawMessage, error)
	byProt map[string]func(json.RawMessage) (json.RawMessage, error)
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer listens on cfg.Addr and starts serving.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 128
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, ln: ln, conn: cfg.Handlers.Connection, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// Addr is the listening address (host:port).
func (s *Server) Addr() string { return s.ln.Addr().String() }

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

func (s *Server) serve() {
	defer s.wg.Done()
	sem := make(chan struct{}, s.cfg.MaxConns)
	for {
		sem <- struct{}{}
		c, err := s.ln.Accept()
		if err != nil {
			<-sem
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // listener closed
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			<-sem
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
				<-sem
				s.wg.Done()
			}()
			s.exchange(c)
		}()
	}
}

// errorReply is what a malformed or refused request gets back.
type errorReply struct {
	Status   string `json:"status"`
	ReplyMsg string `json:"reply_msg"`
}

func (s *Server) exchange(c net.Conn) {
	c.SetDeadline(time.Now().Add(s.cfg.Timeout))
	t, body, err := ReadFrame(c, s.cfg.MaxFrame)
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
	case errors.Is(err, io.EOF):
		return // peer connected and left (port probes, health checks)
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
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	var one [1]byte
	c.Read(one[:])
}

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

// Close stops the server and waits for running exchanges.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}
