package drpcx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"storj.io/drpc"
	"storj.io/drpc/drpcconn"
	"storj.io/drpc/drpcerr"
	"storj.io/drpc/drpcmanager"
	"storj.io/drpc/drpcmux"
	"storj.io/drpc/drpcserver"
	"storj.io/drpc/drpcstream"
	"storj.io/drpc/drpcwire"

	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/internal/pbcodec"
)

// Bounds.
const (
	MaxMessage = 256 << 20
	MaxConns   = 64
)

func managerOptions() drpcmanager.Options {
	return drpcmanager.Options{
		Reader: drpcwire.ReaderOptions{MaximumBufferSize: MaxMessage},
		Stream: drpcstream.Options{MaximumBufferSize: MaxMessage},
	}
}

// enc is protobuf, with raw requests on the server side.
type enc struct{}

func (enc) Marshal(msg drpc.Message) ([]byte, error) {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("drpcx: %T is not a protobuf message", msg)
	}
	return pbcodec.Marshal(m)
}

func (enc) Unmarshal(buf []byte, msg drpc.Message) error {
	switch m := msg.(type) {
	case *raw:
		m.b = append(m.b[:0], buf...) // drpc reuses buf
		return nil
	case proto.Message:
		return pbcodec.Unmarshal(buf, m)
	}
	return fmt.Errorf("drpcx: %T is not a protobuf message", msg)
}

// raw is a request as received: the gRPC handler decodes it.
type raw struct{ b []byte }

// desc is a grpc.ServiceDesc's unary methods as a drpc.Description.
type desc struct {
	names     []string
	handlers  []grpc.MethodHandler
	intercept grpc.UnaryServerInterceptor
}

// methodType is what drpcmux reads a unary method's input type from.
var methodType = reflect.TypeOf(func(any, context.Context, *raw) (*raw, error) { return nil, nil })

func (d *desc) NumMethods() int { return len(d.names) }

func (d *desc) Method(i int) (string, drpc.Encoding, drpc.Receiver, any, bool) {
	if i < 0 || i >= len(d.names) {
		return "", nil, nil, nil, false
	}
	h, name := d.handlers[i], d.names[i]
	recv := func(srv any, ctx context.Context, in1, _ any) (drpc.Message, error) {
		in := in1.(*raw)
		dec := func(v any) error {
			m, ok := v.(proto.Message)
			if !ok {
				return status.Errorf(codes.Internal, "drpcx: %T is not a protobuf message", v)
			}
			if err := pbcodec.Unmarshal(in.b, m); err != nil {
				return status.Errorf(codes.InvalidArgument, "drpcx: decoding %s: %v", name, err)
			}
			return nil
		}
		out, err := h(srv, ctx, dec, d.intercept)
		if err != nil {
			return nil, encodeError(err)
		}
		return out, nil
	}
	return name, enc{}, recv, reflect.Zero(methodType).Interface(), true
}

// encodeError carries a gRPC status through drpc's (code, message) error.
func encodeError(err error) error {
	st := status.Convert(err)
	b, merr := proto.Marshal(st.Proto())
	if merr != nil {
		return drpcerr.WithCode(errors.New(st.Message()), uint64(st.Code()))
	}
	return drpcerr.WithCode(errors.New(string(b)), uint64(st.Code()))
}

// decodeError turns a call's error back into a gRPC status.
func decodeError(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := drpcerr.Code(err)
	if code == 0 || code > uint64(codes.Unauthenticated) {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return status.FromContextError(err).Err()
		}
		return status.Errorf(codes.Unavailable, "drpcx: %v", err)
	}
	var st spb.Status
	if proto.Unmarshal([]byte(err.Error()), &st) != nil || st.Code != int32(code) {
		return status.Error(codes.Code(code), err.Error())
	}
	return status.ErrorProto(&st)
}

// Server serves registered services over drpc.
type Server struct {
	mux       *drpcmux.Mux
	srv       *drpcserver.Server
	intercept grpc.UnaryServerInterceptor
	conns     netx.Config
}

// NewServer returns a server with no services; intercept, when not nil,
// wraps every call (the grpc.Server's chain). conns configures the accept
// loop.
func NewServer(intercept grpc.UnaryServerInterceptor, conns netx.Config) *Server {
	s := &Server{mux: drpcmux.New(), intercept: intercept, conns: conns}
	s.srv = drpcserver.NewWithOptions(s.mux, drpcserver.Options{Manager: managerOptions()})
	if s.conns.Name == "" {
		s.conns.Name = "drpc"
	}
	return s
}

// Register serves impl's unary methods (gd is its generated gRPC
// description, e.g. storepb.MasterService_ServiceDesc). Register before
// Serve.
func (s *Server) Register(gd *grpc.ServiceDesc, impl any) error {
	d := &desc{intercept: s.intercept}
	for _, m := range gd.Methods {
		d.names = append(d.names, "/"+gd.ServiceName+"/"+m.MethodName)
		d.handlers = append(d.handlers, m.Handler)
	}
	return s.mux.Register(impl, d)
}

// Serve accepts on lis until ctx ends (then it closes lis and every
// connection, and returns nil once their handlers have returned) or lis
// fails.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l := netx.Serve(lis, s.conns, func(c *netx.Conn) {
		c.Busy() // one call at a time, on long-lived connections
		s.srv.ServeOne(ctx, c)
	})
	select {
	case <-ctx.Done():
		l.Close() // closes the connections, waits for their handlers
		return nil
	case <-l.Done():
		l.Close()
		if err := l.Err(); err != nil {
			return fmt.Errorf("drpcx: accept: %w", err)
		}
		return nil
	}
}

// Conn is a pool of drpc connections to one server, for generated gRPC
// client code (grpc.ClientConnInterface). Safe for concurrent use.
type Conn struct {
	addr      string
	intercept grpc.UnaryClientInterceptor
	slots     chan struct{}       // connections open or being dialled
	idle      chan *drpcconn.Conn // open and not in a call
	done      chan struct{}       // closed by Close
	once      sync.Once
}

var _ grpc.ClientConnInterface = (*Conn)(nil)

// Dial returns a pool for addr and checks one connection can be opened.
// intercept, when not nil, sees every call.
func Dial(ctx context.Context, addr string, intercept grpc.UnaryClientInterceptor) (*Conn, error) {
	c := &Conn{addr: addr, intercept: intercept, slots: make(chan struct{}, MaxConns),
		idle: make(chan *drpcconn.Conn, MaxConns), done: make(chan struct{})}
	c.slots <- struct{}{}
	dc, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.put(dc)
	return c, nil
}

func (c *Conn) dial(ctx context.Context) (*drpcconn.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		<-c.slots
		return nil, status.Errorf(codes.Unavailable, "drpcx: dial %s: %v", c.addr, err)
	}
	return drpcconn.NewWithOptions(nc, drpcconn.Options{Manager: managerOptions()}), nil
}

// get returns an idle connection, or dials one while fewer than MaxConns
// are open, or waits for one within ctx.
func (c *Conn) get(ctx context.Context) (*drpcconn.Conn, error) {
	for {
		var dc *drpcconn.Conn
		select {
		case <-c.done:
			return nil, status.Error(codes.Canceled, "drpcx: connection closed")
		case dc = <-c.idle:
		default:
			select {
			case <-c.done:
				return nil, status.Error(codes.Canceled, "drpcx: connection closed")
			case dc = <-c.idle:
			case c.slots <- struct{}{}:
				return c.dial(ctx)
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		select {
		case <-dc.Closed(): // broke while idle
			<-c.slots
		default:
			return dc, nil
		}
	}
}

// put returns a connection to the pool, or closes it when it broke or
// the pool closed.
func (c *Conn) put(dc *drpcconn.Conn) {
	select {
	case <-dc.Closed():
	case <-c.done:
	default:
		c.idle <- dc // never blocks: at most MaxConns exist
		select {
		case <-c.done: // Close may have drained already
			c.drain()
		default:
		}
		return
	}
	dc.Close()
	<-c.slots
}

func (c *Conn) drain() {
	for {
		select {
		case dc := <-c.idle:
			dc.Close()
			<-c.slots
		default:
			return
		}
	}
}

// Invoke implements grpc.ClientConnInterface. Call options are ignored.
func (c *Conn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if c.intercept != nil {
		return c.intercept(ctx, method, args, reply, nil, c.invoke, opts...)
	}
	return c.invoke(ctx, method, args, reply, nil)
}

func (c *Conn) invoke(ctx context.Context, method string, args, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
	dc, err := c.get(ctx)
	if err != nil {
		return err
	}
	err = dc.Invoke(ctx, method, enc{}, args, reply)
	if ctx.Err() != nil {
		// drpc tears a connection down after a cancelled call, in the
		// background: pooled, the next call on it got this call's error.
		dc.Close()
		<-c.slots
	} else {
		c.put(dc)
	}
	if err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return decodeError(err)
	}
	return nil
}

// NewStream implements grpc.ClientConnInterface: not supported.
func (c *Conn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "drpcx: streams are not supported")
}

// Close closes the idle connections; those in a call close when it
// ends.
func (c *Conn) Close() error {
	c.once.Do(func() { close(c.done) })
	c.drain()
	return nil
}
