package crpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Option configures Dial.
type Option func(*Conn)

// WithUnaryInterceptor runs every call through f (its *grpc.ClientConn
// argument is nil).
func WithUnaryInterceptor(f grpc.UnaryClientInterceptor) Option {
	return func(c *Conn) { c.intercept = f }
}

// WithDialTimeout bounds each (re)connection (default 5 s).
func WithDialTimeout(d time.Duration) Option { return func(c *Conn) { c.dialTimeout = d } }

// Conn is a client of one crpc server, usable by generated gRPC client
// code (grpc.ClientConnInterface). It keeps one connection, dialled again
// after a failure. Safe for concurrent use.
type Conn struct {
	addr        string
	dialTimeout time.Duration
	intercept   grpc.UnaryClientInterceptor

	mu     sync.Mutex
	cur    *clientConn
	closed bool
	wg     sync.WaitGroup // readers
}

var _ grpc.ClientConnInterface = (*Conn)(nil)

// Dial connects to addr and checks the server speaks crpc (ErrNotCRPC if
// it answers otherwise).
func Dial(ctx context.Context, addr string, opts ...Option) (*Conn, error) {
	c := &Conn{addr: addr, dialTimeout: 5 * time.Second}
	for _, o := range opts {
		o(c)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cc, err := c.dialLocked(ctx)
	if err != nil {
		return nil, err
	}
	c.cur = cc
	return c, nil
}

// Close closes the connection; calls in flight fail with CANCELED.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.closed = true
	cc := c.cur
	c.cur = nil
	c.mu.Unlock()
	if cc != nil {
		cc.fail(status.Error(codes.Canceled, "crpc: connection closed"))
	}
	c.wg.Wait()
	return nil
}

// NewStream implements grpc.ClientConnInterface: crpc has no streams.
func (c *Conn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "crpc: streams are not supported")
}

// Invoke implements grpc.ClientConnInterface. Call options are ignored.
func (c *Conn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	if c.intercept != nil {
		return c.intercept(ctx, method, args, reply, nil, c.invoke, opts...)
	}
	return c.invoke(ctx, method, args, reply, nil)
}

func (c *Conn) invoke(ctx context.Context, method string, args, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
	in, ok := args.(proto.Message)
	out, ok2 := reply.(proto.Message)
	if !ok || !ok2 {
		return status.Errorf(codes.Internal, "crpc: %T and %T must be protobuf messages", args, reply)
	}
	if len(method) == 0 || len(method) > 255 {
		return status.Errorf(codes.Internal, "crpc: method name of %d bytes", len(method))
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	cc, err := c.conn(ctx)
	if err != nil {
		return err
	}
	buf := make([]byte, headerLen+1, headerLen+1+len(method)+proto.Size(in))
	buf[headerLen] = byte(len(method))
	buf = append(buf, method...)
	if buf, err = (proto.MarshalOptions{}).MarshalAppend(buf, in); err != nil {
		return status.Errorf(codes.Internal, "crpc: encoding %s: %v", method, err)
	}
	ch := make(chan frame, 1)
	id, err := cc.add(ch)
	if err != nil {
		return err
	}
	if err := putHeader(buf, id, kindRequest); err != nil {
		cc.remove(id)
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	sent := time.Now().UnixNano()
	if err := cc.write(buf); err != nil {
		cc.remove(id)
		return err
	}
	select {
	case f := <-ch:
		if f.kind == kindError {
			var st spb.Status
			if err := proto.Unmarshal(f.body, &st); err != nil {
				return status.Errorf(codes.Internal, "crpc: decoding an error of %s: %v", method, err)
			}
			if st.Code == int32(codes.OK) {
				st.Code = int32(codes.Unknown) // an error frame is never OK
			}
			return status.ErrorProto(&st)
		}
		if err := proto.Unmarshal(f.body, out); err != nil {
			return status.Errorf(codes.Internal, "crpc: decoding the reply of %s: %v", method, err)
		}
		return nil
	case <-cc.done:
		return cc.err
	case <-ctx.Done():
		cc.remove(id)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && cc.lastRead.Load() < sent {
			// Not a byte from the server since this call went out: it may
			// be gone without a FIN (host down, partition). The next call
			// dials again rather than wait for TCP to notice.
			cc.fail(status.Error(codes.Unavailable, "crpc: no reply from the server"))
		}
		return status.FromContextError(ctx.Err()).Err()
	}
}

// conn returns the live connection, dialling one when there is none.
func (c *Conn) conn(ctx context.Context) (*clientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, status.Error(codes.Canceled, "crpc: connection closed")
	}
	if c.cur != nil && !c.cur.broken() {
		return c.cur, nil
	}
	cc, err := c.dialLocked(ctx)
	if err != nil {
		return nil, err
	}
	c.cur = cc
	return cc, nil
}

func (c *Conn) dialLocked(ctx context.Context) (*clientConn, error) {
	dctx, cancel := context.WithTimeout(ctx, c.dialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dctx, "tcp", c.addr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "crpc: dial %s: %v", c.addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	deadline, _ := dctx.Deadline()
	nc.SetDeadline(deadline)
	p := make([]byte, prefaceLen)
	_, err = nc.Write(preface())
	if err == nil {
		_, err = io.ReadFull(nc, p)
	}
	if err == nil {
		err = checkPreface(p)
	} else if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		err = fmt.Errorf("%w (it closed the connection)", ErrNotCRPC)
	}
	if err != nil {
		nc.Close()
		code := codes.Unavailable
		if errors.Is(err, ErrNotCRPC) {
			return nil, err
		}
		return nil, status.Errorf(code, "crpc: %s: %v", c.addr, err)
	}
	nc.SetDeadline(time.Time{})
	cc := &clientConn{c: nc, pending: map[uint32]chan frame{}, done: make(chan struct{})}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		cc.read()
	}()
	return cc, nil
}

// clientConn is one connection and its calls in flight.
type clientConn struct {
	c    net.Conn
	wmu  sync.Mutex
	done chan struct{} // closed when broken; err says why

	mu       sync.Mutex
	pending  map[uint32]chan frame
	next     uint32
	err      error
	lastRead atomic.Int64 // unix ns of the last frame received
}

func (cc *clientConn) broken() bool {
	select {
	case <-cc.done:
		return true
	default:
		return false
	}
}

func (cc *clientConn) add(ch chan frame) (uint32, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.err != nil {
		return 0, cc.err
	}
	cc.next++
	for cc.pending[cc.next] != nil {
		cc.next++ // wrapped around onto a call still in flight
	}
	cc.pending[cc.next] = ch
	return cc.next, nil
}

func (cc *clientConn) remove(id uint32) {
	cc.mu.Lock()
	delete(cc.pending, id)
	cc.mu.Unlock()
}

func (cc *clientConn) write(b []byte) error {
	cc.wmu.Lock()
	_, err := cc.c.Write(b)
	cc.wmu.Unlock()
	if err != nil {
		err = status.Errorf(codes.Unavailable, "crpc: send: %v", err)
		cc.fail(err)
	}
	return err
}

// read delivers replies until the connection breaks.
func (cc *clientConn) read() {
	rd := newReader(cc.c)
	for {
		f, err := rd.next()
		if err == nil && f.kind == kindRequest {
			err = fmt.Errorf("%w: a request from the server", errBadFrame)
		}
		if err != nil {
			cc.fail(status.Errorf(codes.Unavailable, "crpc: connection lost: %v", err))
			return
		}
		cc.lastRead.Store(time.Now().UnixNano())
		cc.mu.Lock()
		ch := cc.pending[f.id]
		delete(cc.pending, f.id)
		cc.mu.Unlock()
		if ch != nil {
			ch <- f // buffered; a caller that gave up has removed its id
		}
	}
}

// fail breaks the connection: calls in flight return err.
func (cc *clientConn) fail(err error) {
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return
	}
	cc.err = err
	cc.pending = map[uint32]chan frame{}
	close(cc.done)
	cc.mu.Unlock()
	cc.c.Close()
}
