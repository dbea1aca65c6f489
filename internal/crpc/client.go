package crpc

import (
	"context"
	"crypto/tls"
	"encoding/binary"
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

// Client defaults.
const (
	DefaultDialTimeout  = 5 * time.Second
	DefaultPingInterval = 10 * time.Second
	DefaultPingTimeout  = 5 * time.Second
)

// Option configures Dial.
type Option func(*Conn)

// WithUnaryInterceptor runs every call through f (its *grpc.ClientConn
// argument is nil).
func WithUnaryInterceptor(f grpc.UnaryClientInterceptor) Option {
	return func(c *Conn) { c.intercept = f }
}

// WithDialTimeout bounds each (re)connection (DefaultDialTimeout).
func WithDialTimeout(d time.Duration) Option { return func(c *Conn) { c.dialTimeout = d } }

// WithMaxFrame bounds a frame's body either way (DefaultMaxFrame; at most
// 1 GiB): a larger request fails RESOURCE_EXHAUSTED, a larger reply
// breaks the connection.
func WithMaxFrame(n int) Option { return func(c *Conn) { c.maxFrame = n } }

// WithPing sets the keepalive: a connection that has received nothing for
// interval (DefaultPingInterval), or whose call timed out with nothing
// received since it was sent, is pinged; no pong within timeout
// (DefaultPingTimeout) breaks it, failing its calls UNAVAILABLE, and the
// next call dials again.
func WithPing(interval, timeout time.Duration) Option {
	return func(c *Conn) { c.pingInterval, c.pingTimeout = interval, timeout }
}

// WithDialer makes every (re)connection dial with d (a local address,
// say) instead of a zero net.Dialer.
func WithDialer(d *net.Dialer) Option { return func(c *Conn) { c.dialer = d } }

// WithTLS makes every (re)connection a TLS client over cfg (a clone;
// ServerName defaults to the dialled host, NextProtos to "crpc"): the
// handshake comes first, within the dial timeout. Present a client
// certificate in cfg for a server that requires one.
func WithTLS(cfg *tls.Config) Option { return func(c *Conn) { c.tls = cfg } }

// WithResolver makes every (re)connection dial the address resolve
// returns (within the dial timeout) instead of Dial's addr, so a
// connection follows a service that moves (the master's leader): after a
// connection breaks, the next call dials wherever resolve points now. An
// error from resolve fails that call UNAVAILABLE.
func WithResolver(resolve func(ctx context.Context) (addr string, err error)) Option {
	return func(c *Conn) { c.resolve = resolve }
}

// Conn is a client of one crpc server, usable by generated gRPC client
// code (grpc.ClientConnInterface). It keeps one connection, dialled again
// after a failure. Safe for concurrent use.
type Conn struct {
	addr         string
	dialTimeout  time.Duration
	intercept    grpc.UnaryClientInterceptor
	maxFrame     int
	pingInterval time.Duration
	pingTimeout  time.Duration
	tls          *tls.Config
	token        []byte // nil: no challenge (WithToken)
	dialer       *net.Dialer
	resolve      func(context.Context) (string, error)

	mu     sync.Mutex
	cur    *clientConn
	closed bool
	wg     sync.WaitGroup // readers, keepalives, cancels
}

var _ grpc.ClientConnInterface = (*Conn)(nil)

// Dial connects to addr and checks the server speaks crpc (ErrNotCRPC if
// it answers otherwise).
func Dial(ctx context.Context, addr string, opts ...Option) (*Conn, error) {
	c := &Conn{addr: addr, dialTimeout: DefaultDialTimeout, maxFrame: DefaultMaxFrame,
		pingInterval: DefaultPingInterval, pingTimeout: DefaultPingTimeout}
	for _, o := range opts {
		o(c)
	}
	if c.maxFrame <= 0 {
		c.maxFrame = DefaultMaxFrame
	}
	c.maxFrame = min(c.maxFrame, maxFrameLimit)
	if c.pingInterval <= 0 {
		c.pingInterval = DefaultPingInterval
	}
	if c.pingTimeout <= 0 {
		c.pingTimeout = DefaultPingTimeout
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cc, err := c.dialLocked(ctx)
	if err != nil {
		return nil, notSent(err)
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
		return notSent(err)
	}
	buf := make([]byte, headerLen+requestFixed, headerLen+requestFixed+len(method)+proto.Size(in))
	buf[headerLen+8] = byte(len(method))
	buf = append(buf, method...)
	if buf, err = (proto.MarshalOptions{}).MarshalAppend(buf, in); err != nil {
		return status.Errorf(codes.Internal, "crpc: encoding %s: %v", method, err)
	}
	ch := replyChans.Get().(chan frame)
	id, err := cc.add(ch)
	if err != nil {
		replyChans.Put(ch)
		return notSent(err)
	}
	if err := putHeader(buf, id, kindRequest, c.maxFrame); err != nil {
		cc.remove(id)
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	if dl, ok := ctx.Deadline(); ok {
		// The handler's context ends when this call's does.
		us := max(1, (time.Until(dl)+time.Microsecond-1)/time.Microsecond)
		binary.LittleEndian.PutUint64(buf[headerLen:], uint64(us))
	}
	sent := time.Now().UnixNano()
	if err := cc.write(ctx, buf); err != nil {
		cc.remove(id)
		return err
	}
	select {
	case f := <-ch:
		return replyOf(ch, f, method, out)
	case <-cc.done:
		// The reader hands a reply over before it sees the end of the
		// stream: a reply that came just before the server closed is
		// the call's answer, not a lost connection.
		select {
		case f := <-ch:
			return replyOf(ch, f, method, out)
		default:
		}
		return cc.err
	case <-ctx.Done():
		if cc.remove(id) {
			c.sendCancel(cc, id)
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && cc.lastRead.Load() < sent {
			// Not a byte from the server since this call went out: it may
			// be gone without a FIN. Ask it now rather than at the next
			// ping.
			cc.kickPing()
		}
		return status.FromContextError(ctx.Err()).Err()
	}
}

// replyOf is a call's outcome from its reply or error frame f; ch, which
// delivered it, goes back to the pool (the reader sends once per call and
// has let go of it).
func replyOf(ch chan frame, f frame, method string, out proto.Message) error {
	replyChans.Put(ch)
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
}

// replyChans recycles calls' reply channels: one that delivered its
// reply is empty and no longer known to the reader.
var replyChans = sync.Pool{New: func() any { return make(chan frame, 1) }}

// sendCancel tells the server a call was given up, in the background (the
// caller is gone; the write waits for the connection's other writes).
func (c *Conn) sendCancel(cc *clientConn, id uint32) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), c.pingTimeout)
		defer cancel()
		cc.write(ctx, control(id, kindCancel))
	}()
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
	addr := c.addr
	if c.resolve != nil {
		a, err := c.resolve(dctx)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "crpc: resolve: %v", err)
		}
		addr = a
	}
	d := c.dialer
	if d == nil {
		d = &net.Dialer{}
	}
	nc, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "crpc: dial %s: %v", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	deadline, _ := dctx.Deadline()
	nc.SetDeadline(deadline)
	if c.tls != nil {
		cfg := c.tls.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		if len(cfg.NextProtos) == 0 {
			cfg.NextProtos = []string{alpn}
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(dctx); err != nil {
			nc.Close()
			return nil, status.Errorf(codes.Unavailable, "crpc: TLS handshake with %s (does it serve TLS?): %v", addr, err)
		}
		nc = tc
	}
	if c.token != nil {
		if err := clientAuth(nc, c.token, addr); err != nil {
			nc.Close()
			return nil, &authError{err}
		}
		nc.SetDeadline(deadline) // the challenge cleared it
	}
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
		if errors.Is(err, ErrNotCRPC) || errors.Is(err, ErrTLSRequired) || errors.Is(err, ErrTokenRequired) {
			return nil, err
		}
		return nil, status.Errorf(codes.Unavailable, "crpc: %s: %v", addr, err)
	}
	nc.SetDeadline(time.Time{})
	cc := &clientConn{c: nc, wg: &c.wg, flushTimeout: c.pingTimeout, maxFrame: c.maxFrame, wsem: make(chan struct{}, 1), pending: map[uint32]chan frame{},
		done: make(chan struct{}), kick: make(chan struct{}, 1), pong: make(chan uint32, 1)}
	cc.lastRead.Store(time.Now().UnixNano())
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		cc.read()
	}()
	go func() {
		defer c.wg.Done()
		cc.keepalive(c.pingInterval, c.pingTimeout)
	}()
	return cc, nil
}

// clientConn is one connection and its calls in flight.
type clientConn struct {
	c            net.Conn
	wg           *sync.WaitGroup // the Conn's
	flushTimeout time.Duration   // for the rest of a frame cut off at a deadline
	maxFrame     int
	wsem         chan struct{} // the write lock; waiters give up at their deadline
	done         chan struct{} // closed when broken; err says why
	kick         chan struct{} // ping now
	pong         chan uint32   // pongs received

	mu       sync.Mutex
	pending  map[uint32]chan frame
	next     uint32
	err      error
	lastRead atomic.Int64 // unix ns of the last frame received
	pongs    atomic.Int64 // pongs received (tests)
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
	for cc.next == 0 || cc.pending[cc.next] != nil {
		cc.next++ // 0 is the pings'; or wrapped onto a call in flight
	}
	cc.pending[cc.next] = ch
	return cc.next, nil
}

// remove forgets a call; false when its reply was already delivered.
func (cc *clientConn) remove(id uint32) bool {
	cc.mu.Lock()
	_, ok := cc.pending[id]
	delete(cc.pending, id)
	cc.mu.Unlock()
	return ok
}

// write sends one frame by ctx's deadline: a call that cannot start
// writing by then fails DEADLINE_EXCEEDED and leaves the connection as it
// was. One cut off mid-frame also returns at once; the rest of its frame
// goes out in the background (the stream must stay framed) within the
// ping timeout, else the connection breaks.
func (cc *clientConn) write(ctx context.Context, b []byte) error {
	select {
	case cc.wsem <- struct{}{}:
	case <-cc.done:
		return cc.err
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	dl, _ := ctx.Deadline()
	cc.c.SetWriteDeadline(dl)
	n, err := cc.c.Write(b)
	if err == nil {
		<-cc.wsem
		return nil
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		<-cc.wsem
		err = status.Errorf(codes.Unavailable, "crpc: send: %v", err)
		cc.fail(err)
		return err
	}
	if n == 0 {
		<-cc.wsem
	} else {
		cc.wg.Add(1)
		go func() {
			defer cc.wg.Done()
			defer func() { <-cc.wsem }()
			cc.c.SetWriteDeadline(time.Now().Add(cc.flushTimeout))
			if _, err := cc.c.Write(b[n:]); err != nil {
				cc.fail(status.Errorf(codes.Unavailable, "crpc: send: %v", err))
			}
		}()
	}
	return status.Error(codes.DeadlineExceeded, "crpc: deadline exceeded while sending")
}

func (cc *clientConn) kickPing() {
	select {
	case cc.kick <- struct{}{}:
	default:
	}
}

// keepalive pings when nothing has been received for interval or when
// asked, and breaks the connection when a pong does not come in timeout.
func (cc *clientConn) keepalive(interval, timeout time.Duration) {
	t := time.NewTimer(interval)
	defer t.Stop()
	var id uint32
	for {
		kicked := false
		select {
		case <-cc.done:
			return
		case <-cc.kick:
			kicked = true
		case <-t.C:
		}
		if quiet := time.Since(time.Unix(0, cc.lastRead.Load())); !kicked && quiet < interval {
			t.Reset(interval - quiet)
			continue
		}
		id++
		if !cc.ping(id, timeout) {
			cc.fail(status.Errorf(codes.Unavailable, "crpc: no pong from the server in %v", timeout))
			return
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(interval)
	}
}

// ping sends a ping and waits for its pong, within timeout.
func (cc *clientConn) ping(id uint32, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if cc.write(ctx, control(id, kindPing)) != nil {
		return false
	}
	for {
		select {
		case got := <-cc.pong:
			if got == id {
				return true
			}
		case <-cc.done:
			return true // failed already; keepalive sees done
		case <-ctx.Done():
			return false
		}
	}
}

// read delivers replies until the connection breaks.
func (cc *clientConn) read() {
	rd := newReader(cc.c, cc.maxFrame)
	for {
		f, err := rd.next()
		if err == nil && f.kind != kindReply && f.kind != kindError && f.kind != kindPong {
			err = fmt.Errorf("%w: kind %d from the server", errBadFrame, f.kind)
		}
		if err != nil {
			cc.fail(status.Errorf(codes.Unavailable, "crpc: connection lost: %v", err))
			return
		}
		cc.lastRead.Store(time.Now().UnixNano())
		if f.kind == kindPong {
			cc.pongs.Add(1)
			select {
			case cc.pong <- f.id:
			default:
				select { // replace a stale one
				case <-cc.pong:
				default:
				}
				select {
				case cc.pong <- f.id:
				default:
				}
			}
			continue
		}
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

// notSentError is the error of a call whose request never left this
// client: no connection could be had, or it had ended before the call
// was registered on it. The server saw nothing, so sending it again is
// safe whatever the method. It keeps the underlying error's status
// (status.Code, errors.Is).
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }
func (e *notSentError) GRPCStatus() *status.Status {
	st, _ := status.FromError(e.err)
	return st
}

func notSent(err error) error {
	if NotSent(err) {
		return err
	}
	return &notSentError{err}
}

// Unsent marks err as the error of a call that was never sent (for
// layers above crpc that fail a call before it reaches a Conn).
func Unsent(err error) error { return notSent(err) }

// NotSent reports whether err comes from a call whose request was never
// sent (see notSentError): a client may send it again, elsewhere too.
func NotSent(err error) bool {
	var e *notSentError
	return errors.As(err, &e)
}
