package crpc

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// ErrServerStopped is returned by Serve after Stop or GracefulStop.
var ErrServerStopped = errors.New("crpc: server stopped")

// prefaceTimeout bounds how long a new connection may take to introduce
// itself.
const prefaceTimeout = 10 * time.Second

type method struct {
	srv any
	h   grpc.MethodHandler
}

// Server serves registered services' unary methods. Register services
// before Serve.
type Server struct {
	methods map[string]method

	mu       sync.Mutex
	lis      map[net.Listener]bool
	conns    map[*serverConn]bool
	stopped  bool
	draining bool
	conWG    sync.WaitGroup // connection goroutines
	callWG   sync.WaitGroup // handlers running
}

var _ grpc.ServiceRegistrar = (*Server)(nil)

// NewServer returns a server with no services.
func NewServer() *Server {
	return &Server{methods: map[string]method{}, lis: map[net.Listener]bool{}, conns: map[*serverConn]bool{}}
}

// RegisterService implements grpc.ServiceRegistrar (unary methods only).
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, m := range desc.Methods {
		s.methods["/"+desc.ServiceName+"/"+m.MethodName] = method{srv: impl, h: m.Handler}
	}
}

// Serve accepts connections on lis until Stop or GracefulStop (then it
// returns ErrServerStopped) or lis fails.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.stopped || s.draining {
		s.mu.Unlock()
		lis.Close()
		return ErrServerStopped
	}
	s.lis[lis] = true
	s.mu.Unlock()
	for {
		c, err := lis.Accept()
		if err != nil {
			s.mu.Lock()
			done := s.stopped || s.draining
			delete(s.lis, lis)
			s.mu.Unlock()
			if done {
				return ErrServerStopped
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return err
		}
		sc := &serverConn{s: s, c: c}
		sc.ctx, sc.cancel = context.WithCancel(context.Background())
		s.mu.Lock()
		if s.stopped || s.draining {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[sc] = true
		s.conWG.Add(1)
		s.mu.Unlock()
		go sc.serve()
	}
}

// Stop closes the listeners and every connection at once, and waits for
// running handlers.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopped = true
	s.closeListenersLocked()
	conns := s.conns
	s.conns = map[*serverConn]bool{}
	s.mu.Unlock()
	for sc := range conns {
		sc.close()
	}
	s.conWG.Wait()
	s.callWG.Wait()
}

// GracefulStop stops accepting, lets the calls in progress finish and
// answer, then closes the connections.
func (s *Server) GracefulStop() {
	s.mu.Lock()
	s.draining = true
	s.closeListenersLocked()
	s.mu.Unlock()
	s.callWG.Wait()
	s.Stop()
}

func (s *Server) closeListenersLocked() {
	for l := range s.lis {
		l.Close()
	}
	s.lis = map[net.Listener]bool{}
}

type serverConn struct {
	s      *Server
	c      net.Conn
	ctx    context.Context
	cancel context.CancelFunc
	wmu    sync.Mutex
	once   sync.Once
}

func (sc *serverConn) close() {
	sc.once.Do(func() {
		sc.cancel()
		sc.c.Close()
	})
}

func (sc *serverConn) serve() {
	defer sc.s.conWG.Done()
	defer func() {
		sc.close()
		sc.s.mu.Lock()
		delete(sc.s.conns, sc)
		sc.s.mu.Unlock()
	}()
	p := make([]byte, prefaceLen)
	sc.c.SetReadDeadline(time.Now().Add(prefaceTimeout))
	if _, err := io.ReadFull(sc.c, p); err != nil || checkPreface(p) != nil {
		// Answer a wrong version with ours, so the client can say why.
		if err == nil && string(p[:4]) == magic {
			sc.c.Write(preface())
		}
		return
	}
	sc.c.SetReadDeadline(time.Time{})
	if _, err := sc.c.Write(preface()); err != nil {
		return
	}
	rd := newReader(sc.c)
	for {
		f, err := rd.next()
		if err != nil || f.kind != kindRequest {
			return
		}
		name, msg, err := parseRequest(f.body)
		if err != nil {
			return
		}
		sc.s.mu.Lock()
		if sc.s.stopped || sc.s.draining {
			sc.s.mu.Unlock()
			// Calls in progress still answer on this connection.
			sc.reply(f.id, nil, status.Error(codes.Unavailable, "crpc: server stopping"))
			continue
		}
		sc.s.callWG.Add(1)
		sc.s.mu.Unlock()
		go sc.call(f.id, name, msg)
	}
}

// call runs one handler and answers.
func (sc *serverConn) call(id uint32, name string, msg []byte) {
	defer sc.s.callWG.Done()
	var resp any
	err := status.Errorf(codes.Unimplemented, "crpc: unknown method %s", name)
	if m, ok := sc.s.methods[name]; ok {
		dec := func(v any) error {
			pm, ok := v.(proto.Message)
			if !ok {
				return status.Errorf(codes.Internal, "crpc: %T is not a protobuf message", v)
			}
			if err := proto.Unmarshal(msg, pm); err != nil {
				return status.Errorf(codes.InvalidArgument, "crpc: decoding %s: %v", name, err)
			}
			return nil
		}
		resp, err = m.h(m.srv, sc.ctx, dec, nil)
	}
	sc.reply(id, resp, err)
}

// reply sends a handler's outcome: the response, or a status when the
// handler failed or the response cannot be sent.
func (sc *serverConn) reply(id uint32, resp any, err error) {
	buf, err := encodeReply(id, resp, err)
	if err != nil {
		buf, _ = encodeReply(id, nil, err)
	}
	sc.wmu.Lock()
	_, werr := sc.c.Write(buf)
	sc.wmu.Unlock()
	if werr != nil {
		sc.close()
	}
}

// encodeReply frames resp (kind reply), or herr's status when herr is not
// nil (kind error); it fails when resp is not a protobuf message, does not
// encode or exceeds MaxFrame.
func encodeReply(id uint32, resp any, herr error) ([]byte, error) {
	var msg proto.Message
	kind := byte(kindReply)
	if herr != nil {
		msg, kind = status.Convert(herr).Proto(), kindError
	} else if pm, ok := resp.(proto.Message); ok {
		msg = pm
	} else {
		return nil, status.Errorf(codes.Internal, "crpc: reply %T is not a protobuf message", resp)
	}
	buf, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, headerLen, headerLen+proto.Size(msg)), msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "crpc: encoding the reply: %v", err)
	}
	if err := putHeader(buf, id, kind); err != nil {
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	}
	return buf, nil
}
