package crpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/internal/pbcodec"
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

// WithPollWait makes a caller that reads its own reply and would block
// first wait up to d for the reply in its own thread (ppoll) before
// parking in Go's netpoller (default 0: never; plain TCP only, not TLS;
// Linux only). It is for callers on a locked OS thread (a cgo export called
// from C or Python): the kernel wakes that thread directly instead of the
// netpoller waking another thread which then wakes it. It costs Go callers
// (the thread blocks for up to d with nothing else to run), so it is off
// unless asked for. A cancel or deadline is seen at most d late.
// d is capped at maxPollWait.
func WithPollWait(d time.Duration) Option {
	return func(c *Conn) { c.pollWait = min(d, maxPollWait) }
}

// maxPollWait bounds WithPollWait: how late a cancel may be seen.
const maxPollWait = 10 * time.Millisecond

// WithCallTimeout bounds every call to d after it starts (or to its
// context's deadline when that is earlier) with no timer per call: a
// sweeper per connection ends calls past their deadline, at most
// sweepTick(d) late, with DEADLINE_EXCEEDED, tells the server (a cancel
// frame) and, as for a context's deadline, pings a server that has sent
// nothing since. The server sees the deadline as a context's. It is for
// callers that would otherwise wrap each of many short calls in
// context.WithTimeout, whose timer and context cost more than the rest of
// the call's bookkeeping. 0 (the default): only the context bounds a call.
func WithCallTimeout(d time.Duration) Option {
	return func(c *Conn) { c.callTimeout = max(d, 0) }
}

// CallTimeout is the WithCallTimeout bound (0: none).
func (c *Conn) CallTimeout() time.Duration { return c.callTimeout }

// sweepTick is how often the sweeper of a WithCallTimeout(d) connection
// looks for calls past their deadline: d/20, within [1 ms, 100 ms].
func sweepTick(d time.Duration) time.Duration {
	return min(max(d/20, time.Millisecond), 100*time.Millisecond)
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
	pollWait     time.Duration
	callTimeout  time.Duration

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
	buf := make([]byte, headerLen+requestFixed, headerLen+requestFixed+len(method)+pbcodec.Size(in))
	buf[headerLen+8] = byte(len(method))
	buf = append(buf, method...)
	if buf, err = pbcodec.Append(buf, in); err != nil {
		return status.Errorf(codes.Internal, "crpc: encoding %s: %v", method, err)
	}
	now := time.Now()
	dl, ctxDL := ctx.Deadline()
	var expire int64 // the sweeper's to enforce (nanotime); 0: ctx's
	if c.callTimeout > 0 {
		if own := now.Add(c.callTimeout); !ctxDL || own.Before(dl) {
			dl, expire = own, int64(own.Sub(clockBase))
		}
	}
	sent := now.UnixNano()
	ch := replyChans.Get().(chan frame)
	id, err := cc.add(ch, sent, expire)
	if err != nil {
		replyChans.Put(ch)
		return notSent(err)
	}
	if err := putHeader(buf, id, kindRequest, c.maxFrame); err != nil {
		cc.remove(id)
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	if !dl.IsZero() {
		// The handler's context ends when this call's does.
		us := max(1, (dl.Sub(now)+time.Microsecond-1)/time.Microsecond)
		binary.LittleEndian.PutUint64(buf[headerLen:], uint64(us))
	}
	// Claimed before the write, so the background reader (if it reads)
	// has yielded by the time the reply comes.
	cc.claim()
	if err := cc.write(ctx, dl, buf); err != nil {
		cc.waiting.Add(-1)
		cc.remove(id)
		return err
	}
	return cc.await(ctx, c, id, ch, sent, method, out)
}

// claim counts the caller among those waiting for a reply (await takes it
// off) and makes the background reader give the read role up.
func (cc *clientConn) claim() {
	cc.waiting.Add(1)
	if cc.bgReading.Load() {
		cc.interrupt()
	}
}

// await waits for call id's reply on ch. A caller that finds nobody
// reading the connection takes the read role itself and reads until its
// own reply is in (see lead), so with one call in flight no other
// goroutine runs; others wait on their channels for whoever reads.
func (cc *clientConn) await(ctx context.Context, c *Conn, id uint32, ch chan frame, sent int64, method string, out proto.Message) error {
	waiting := true // claimed
	defer func() {
		if waiting {
			cc.waiting.Add(-1)
		}
	}()
	for {
		select {
		case f := <-ch:
			return replyOf(ch, f, method, out)
		case <-cc.role:
		default:
			if !waiting {
				cc.claim()
				waiting = true
			}
			select {
			case f := <-ch:
				return replyOf(ch, f, method, out)
			case <-cc.role:
			case <-cc.done:
				return cc.doneErr(ch, method, out)
			case <-ctx.Done():
				return cc.given(ctx, c, id, sent)
			}
		}
		if waiting {
			waiting = false
			cc.waiting.Add(-1)
		}
		f, got := cc.lead(ctx, ch)
		cc.release()
		switch {
		case got:
			return replyOf(ch, f, method, out)
		case cc.broken():
			return cc.doneErr(ch, method, out)
		case ctx.Err() != nil:
			return cc.given(ctx, c, id, sent)
		}
	}
}

// doneErr is the outcome of a call on a broken connection. A reader
// hands a reply over before it sees the end of the stream: a reply that
// came just before the server closed is the call's answer, not a lost
// connection.
func (cc *clientConn) doneErr(ch chan frame, method string, out proto.Message) error {
	select {
	case f := <-ch:
		return replyOf(ch, f, method, out)
	default:
	}
	return cc.err
}

// sweep ends cc's calls past their call timeout every tick until cc
// breaks: each gets kindExpired on its channel (a reply that comes later
// finds no call and is dropped), the server a cancel, and a server silent
// since the call went out a ping, as given does for a context's deadline.
// The read is interrupted so that a caller blocked reading for its own
// reply (lead) sees the expiry; another reader loses one wake-up.
func (c *Conn) sweep(cc *clientConn, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	var ids []uint32
	for {
		select {
		case <-cc.done:
			return
		case <-t.C:
		}
		now := nanotime()
		ids = ids[:0]
		silent := false
		cc.mu.Lock()
		for id, cl := range cc.pending {
			if cl.expire != 0 && cl.expire <= now {
				delete(cc.pending, id)
				cl.ch <- frame{id: id, kind: kindExpired} // buffered, and no one else sends now
				ids = append(ids, id)
				silent = silent || cc.lastRead.Load() < cl.sent
			}
		}
		cc.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		cc.interrupt()
		for _, id := range ids {
			c.sendCancel(cc, id)
		}
		if silent {
			cc.kickPing()
		}
	}
}

// given ends a call whose context ended before its reply came.
func (cc *clientConn) given(ctx context.Context, c *Conn, id uint32, sent int64) error {
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

// replyOf is a call's outcome from its reply or error frame f (or the
// sweeper's kindExpired); ch, which delivered it, goes back to the pool
// (the reader or sweeper sends once per call and has let go of it).
func replyOf(ch chan frame, f frame, method string, out proto.Message) error {
	replyChans.Put(ch)
	switch f.kind {
	case kindExpired:
		return status.Errorf(codes.DeadlineExceeded, "crpc: %s: no reply within the call timeout", method)
	case kindError:
		var st spb.Status
		if err := proto.Unmarshal(f.body, &st); err != nil {
			return status.Errorf(codes.Internal, "crpc: decoding an error of %s: %v", method, err)
		}
		if st.Code == int32(codes.OK) {
			st.Code = int32(codes.Unknown) // an error frame is never OK
		}
		return status.ErrorProto(&st)
	}
	if err := pbcodec.Unmarshal(f.body, out); err != nil {
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
		cc.writeCtx(ctx, control(id, kindCancel))
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
	cc := &clientConn{c: nc, wg: &c.wg, flushTimeout: c.pingTimeout, maxFrame: c.maxFrame, wsem: make(chan struct{}, 1), pending: map[uint32]inflight{},
		done: make(chan struct{}), kick: make(chan struct{}, 1), pong: make(chan uint32, 1),
		role: make(chan struct{}, 1)}
	r := newPollConn(nc, c.pollWait)
	cc.pc, _ = r.(*pollConn)
	// Poll-waiting callers sit on locked threads (cgo), where a yield
	// costs two thread switches instead of one goroutine switch.
	cc.noYield = c.pollWait > 0
	cc.rd = newFrameReader(r, c.maxFrame)
	cc.interrupt = cc.interruptRead
	cc.role <- struct{}{}
	cc.lastRead.Store(time.Now().UnixNano())
	cc.lastLead.Store(nanotime())
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		cc.background()
	}()
	if c.callTimeout > 0 {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.sweep(cc, sweepTick(c.callTimeout))
		}()
	}
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
	// role holds the read role's one token while nobody reads: a
	// caller waiting for its reply takes it and reads (lead), as does
	// the background reader on an idle connection.
	role      chan struct{}
	rd        *frameReader // the role holder's; resumable
	pc        *pollConn    // under rd when callers poll (pollWait); nil: not
	waiting   atomic.Int32 // callers waiting for a reply without the role
	bgReading atomic.Bool  // the background reader holds the role
	dlSet     atomic.Bool  // an interrupt may have set a read deadline
	interrupt func()       // interruptRead, bound once (a method value allocates)
	lastLead  atomic.Int64 // nanotime when a caller last gave the role back
	noYield   bool         // release does not yield (WithPollWait)

	mu       sync.Mutex
	pending  map[uint32]inflight
	next     uint32
	err      error
	lastRead atomic.Int64 // unix ns of the last frame received
	pongs    atomic.Int64 // pongs received (tests)
	handed   atomic.Int64 // replies read by another goroutine than their caller's (tests)
}

func (cc *clientConn) broken() bool {
	select {
	case <-cc.done:
		return true
	default:
		return false
	}
}

// inflight is a call in flight: where its reply goes, when it was sent (unix
// ns) and when the sweeper ends it (nanotime; 0: its context does).
type inflight struct {
	ch           chan frame
	sent, expire int64
}

func (cc *clientConn) add(ch chan frame, sent, expire int64) (uint32, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.err != nil {
		return 0, cc.err
	}
	cc.next++
	for cc.next == 0 || cc.pending[cc.next].ch != nil {
		cc.next++ // 0 is the pings'; or wrapped onto a call in flight
	}
	cc.pending[cc.next] = inflight{ch, sent, expire}
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

// writeCtx is write bounded by ctx alone (control frames).
func (cc *clientConn) writeCtx(ctx context.Context, b []byte) error {
	dl, _ := ctx.Deadline()
	return cc.write(ctx, dl, b)
}

// write sends one frame by dl (the context's deadline, or a call
// timeout's earlier one): a call that cannot start writing by then fails
// DEADLINE_EXCEEDED and leaves the connection as it was. One cut off
// mid-frame also returns at once; the rest of its frame goes out in the
// background (the stream must stay framed) within the ping timeout, else
// the connection breaks.
func (cc *clientConn) write(ctx context.Context, dl time.Time, b []byte) error {
	select {
	case cc.wsem <- struct{}{}:
	default:
		// Behind another write: wait within ctx and dl (which may be a
		// call timeout's, earlier than ctx's deadline or without one).
		var expired <-chan time.Time
		if !dl.IsZero() {
			t := time.NewTimer(time.Until(dl))
			defer t.Stop()
			expired = t.C
		}
		select {
		case cc.wsem <- struct{}{}:
		case <-cc.done:
			return cc.err
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-expired:
			return status.Error(codes.DeadlineExceeded, "crpc: deadline exceeded waiting to send")
		}
	}
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
	if cc.writeCtx(ctx, control(id, kindPing)) != nil {
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

// idleRead is how long after a caller last read the connection the
// background reader starts reading it (so an idle connection still sees
// a server's FIN or RST at once); callers in between read for
// themselves.
const idleRead = time.Millisecond

// past is a read deadline that has passed: it interrupts a blocked Read.
var past = time.Unix(1, 0)

// interruptRead makes the connection's current Read (if any) return a
// timeout. The reader resumes its frame where it stopped (the assembly
// state is the clientConn's), so an interrupt that lands on another
// reader than meant costs that reader one wake-up, nothing more.
func (cc *clientConn) interruptRead() {
	cc.dlSet.Store(true)
	cc.c.SetReadDeadline(past)
}

// clearDeadline undoes interrupts before a read. After a timeout it must
// run (force): an interrupt may have been consumed by a reader before.
func (cc *clientConn) clearDeadline(force bool) {
	if cc.dlSet.Swap(false) || force {
		cc.c.SetReadDeadline(time.Time{})
	}
}

// release gives the read role back: a waiting caller or, once the
// connection has been idle for idleRead, the background reader takes it.
// A waiting caller woken by the token would otherwise sit in the run
// queue until this goroutine blocks, which is after its whole next call
// is sent, while its reply may already be in (TestReleaseYieldsToNextReader).
func (cc *clientConn) release() {
	cc.lastLead.Store(nanotime())
	cc.role <- struct{}{} // never blocks: there is one token
	if !cc.noYield && cc.waiting.Load() > 0 {
		runtime.Gosched()
	}
}

// lead reads frames, delivering other calls' replies and pongs, until
// ch's own reply comes (got), ctx ends or the connection breaks. The
// caller holds the read role.
func (cc *clientConn) lead(ctx context.Context, ch chan frame) (f frame, got bool) {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, cc.interrupt)
		defer stop()
	}
	if cc.pc != nil {
		cc.pc.poll = true
		defer func() { cc.pc.poll = false }()
	}
	force := false
	for {
		// Deadline cleared first, then ctx checked: an interrupt for
		// this ctx lands after the clearing, so it cannot be lost.
		cc.clearDeadline(force)
		select {
		case f := <-ch: // delivered by a reader before this one
			return f, true
		default:
		}
		if ctx.Err() != nil || cc.broken() {
			return frame{}, false
		}
		f, err := cc.rd.next()
		if err != nil {
			if isTimeout(err) {
				force = true
				continue // an interrupt: ours (ctx checked above) or a stray one
			}
			cc.readFailed(err)
			return frame{}, false
		}
		force = false
		if cc.deliver(f, ch) {
			return f, true
		}
	}
}

// background reads the connection while no caller does and it has been
// idle for idleRead, so a server that closes or dies is seen at once,
// as with a dedicated reader; it yields to the first caller that waits.
func (cc *clientConn) background() {
	t := time.NewTimer(idleRead)
	defer t.Stop()
	for {
		select {
		case <-cc.done:
			return
		case <-t.C:
		}
		if quiet := time.Duration(nanotime() - cc.lastLead.Load()); quiet < idleRead {
			t.Reset(idleRead - quiet)
			continue
		}
		select {
		case <-cc.role:
		default:
			t.Reset(idleRead) // a caller reads
			continue
		}
		cc.bgReading.Store(true)
		force := false
		for {
			// As in lead: clear, then look at waiting, so a caller's
			// interrupt (it raised waiting first) cannot be lost.
			cc.clearDeadline(force)
			if cc.waiting.Load() > 0 || cc.broken() {
				break
			}
			f, err := cc.rd.next()
			if err != nil {
				if isTimeout(err) {
					force = true
					continue
				}
				cc.readFailed(err)
				break
			}
			force = false
			cc.deliver(f, nil)
		}
		cc.bgReading.Store(false)
		cc.role <- struct{}{}
		if cc.broken() {
			return
		}
		t.Reset(idleRead)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (cc *clientConn) readFailed(err error) {
	cc.fail(status.Errorf(codes.Unavailable, "crpc: connection lost: %v", err))
}

// deliver hands frame f to its call (true: it is own's, which is not
// sent on) or, a pong, to the keepalive.
func (cc *clientConn) deliver(f frame, own chan frame) bool {
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
		return false
	}
	cc.mu.Lock()
	ch := cc.pending[f.id].ch
	delete(cc.pending, f.id)
	cc.mu.Unlock()
	if ch == nil {
		return false
	}
	if ch == own {
		return true
	}
	cc.handed.Add(1)
	ch <- f // buffered; a caller that gave up has removed its id
	return false
}

// frameReader assembles the server's frames resumably: a read that
// times out (an interrupt) leaves what it had read in the state, and the
// next call goes on from there, so the read role can change hands in the
// middle of a frame.
type frameReader struct {
	r   *bufio.Reader
	max int
	hdr [headerLen]byte
	hn  int   // header bytes in
	f   frame // the frame being read, once its header is in
	n   int   // its declared body length
}

func newFrameReader(r io.Reader, max int) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// next returns the next whole frame; on an error what was read so far
// stays (only a timeout is worth resuming after).
func (fr *frameReader) next() (frame, error) {
	for fr.hn < headerLen {
		m, err := fr.r.Read(fr.hdr[fr.hn:])
		fr.hn += m
		if fr.hn == headerLen {
			if err := fr.header(); err != nil {
				return frame{}, err
			}
			break
		}
		if err != nil {
			if errors.Is(err, io.EOF) && fr.hn > 0 {
				err = io.ErrUnexpectedEOF
			}
			return frame{}, err
		}
	}
	// The body grows as its bytes arrive: a header alone must not make
	// the client allocate what it declares.
	for len(fr.f.body) < fr.n {
		if len(fr.f.body) == cap(fr.f.body) {
			if _, err := fr.r.Peek(1); err != nil {
				return frame{}, unexpected(err)
			}
			nb := make([]byte, len(fr.f.body), min(fr.n, max(2*cap(fr.f.body), growStep)))
			copy(nb, fr.f.body)
			fr.f.body = nb
		}
		m, err := fr.r.Read(fr.f.body[len(fr.f.body):cap(fr.f.body)])
		fr.f.body = fr.f.body[:len(fr.f.body)+m]
		if err != nil && len(fr.f.body) < fr.n {
			return frame{}, unexpected(err)
		}
	}
	f := fr.f
	fr.hn, fr.f, fr.n = 0, frame{}, 0
	return f, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// header checks a complete header: a client receives only replies,
// errors and pongs.
func (fr *frameReader) header() error {
	n := binary.LittleEndian.Uint32(fr.hdr[0:4])
	fr.f = frame{id: binary.LittleEndian.Uint32(fr.hdr[4:8]), kind: fr.hdr[8]}
	if uint64(n) > uint64(fr.max) {
		return fmt.Errorf("%w: %d-byte body > %d", errBadFrame, n, fr.max)
	}
	switch fr.f.kind {
	case kindReply, kindError:
	case kindPong:
		if n != 0 {
			return fmt.Errorf("%w: kind %d with a %d-byte body", errBadFrame, fr.f.kind, n)
		}
	default:
		return fmt.Errorf("%w: kind %d from the server", errBadFrame, fr.f.kind)
	}
	fr.n = int(n)
	return nil
}

// fail breaks the connection: calls in flight return err.
func (cc *clientConn) fail(err error) {
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return
	}
	cc.err = err
	cc.pending = map[uint32]inflight{}
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

// clockBase makes nanotime monotonic (time.Since reads the monotonic
// clock).
var clockBase = time.Now()

func nanotime() int64 { return int64(time.Since(clockBase)) }
