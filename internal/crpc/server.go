package crpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/internal/budget"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/internal/pbcodec"
)

// ErrServerStopped is returned by Serve after Stop or GracefulStop.
var ErrServerStopped = errors.New("crpc: server stopped")

// prefaceTimeout bounds how long a new connection may take to introduce
// itself.
const prefaceTimeout = 10 * time.Second

// Server defaults (ServerConfig).
const (
	DefaultMaxCallsPerConn = 256
	DefaultMaxCalls        = 4096
	DefaultIdleTimeout     = 60 * time.Second
	DefaultFrameTimeout    = 10 * time.Second
	DefaultWriteTimeout    = 10 * time.Second
	DefaultMaxBuffered     = 1 << 30
)

// ServerConfig bounds a Server. Zero values take the defaults.
type ServerConfig struct {
	// MaxFrame bounds a frame's body, either way (DefaultMaxFrame; at
	// most 1 GiB). A larger request closes the connection; a larger
	// reply is answered RESOURCE_EXHAUSTED.
	MaxFrame int
	// MaxBufferedBytes bounds the request bytes held at once across
	// connections: bodies being read (reserved as they grow, not as
	// declared) and requests whose call has not answered yet
	// (DefaultMaxBuffered, 1 GiB; at least MaxFrame). A reader that
	// needs more waits, within its frame's deadline, else its connection
	// is dropped.
	MaxBufferedBytes int64
	// MaxCallsPerConn bounds the calls one connection has in flight
	// (DefaultMaxCallsPerConn). At the bound the server stops reading
	// that connection until a call ends.
	MaxCallsPerConn int
	// MaxCalls bounds the calls in flight across connections
	// (DefaultMaxCalls), with the same back-pressure.
	MaxCalls int
	// IdleTimeout closes a connection that sends no frame for this long
	// (DefaultIdleTimeout). Clients ping well within it.
	IdleTimeout time.Duration
	// FrameTimeout bounds the arrival of the rest of a frame once its
	// header is in (DefaultFrameTimeout): a partial frame is dropped.
	FrameTimeout time.Duration
	// WriteTimeout bounds one frame's write (DefaultWriteTimeout): a peer
	// that stops reading loses its connection.
	WriteTimeout time.Duration
	// Interceptor, when set, wraps every call, as
	// grpc.UnaryInterceptor does for a grpc.Server (the same hook serves
	// both).
	Interceptor grpc.UnaryServerInterceptor
	// Inline, when set, picks the methods whose calls may run on their
	// connection's reader instead of a goroutine of their own: no
	// hand-off between goroutines (threads, when the process was idle)
	// per call, which at small calls costs more than the handler. It is
	// asked once per method at registration and returns nil (never) or
	// a check made before each call (true: this one runs inline). The
	// connection reads its next frame when an inline call returns, so
	// its handler must not wait on anything that takes long (I/O, other
	// calls, timers) without calling Detach first; one that does stalls
	// its own connection, no other.
	Inline func(method string) func() bool
	// Conns configures the accept loop (netx): connection caps, logging.
	Conns netx.Config
	// TLS, when set, makes Serve handshake every connection (within the
	// preface timeout) before crpc's preface; a plaintext crpc client is
	// told the server requires TLS. Connections from SplitTLS arrive
	// handshaken already.
	TLS *tls.Config
}

// CallBounds are MaxCallsPerConn and MaxCalls with the defaults applied.
func (c ServerConfig) CallBounds() (perConn, total int) {
	d := c.withDefaults()
	return d.MaxCallsPerConn, d.MaxCalls
}

// ByteBounds returns MaxBufferedBytes and FrameTimeout with their
// defaults: the master bounds its gRPC requests' bytes by them too.
func (c ServerConfig) ByteBounds() (maxBuffered int64, frameTimeout time.Duration) {
	d := c.withDefaults()
	return d.MaxBufferedBytes, d.FrameTimeout
}

// WriteBound is WriteTimeout with its default: the master bounds its
// gRPC writes by it too.
func (c ServerConfig) WriteBound() time.Duration { return c.withDefaults().WriteTimeout }

func (c ServerConfig) withDefaults() ServerConfig {
	if c.MaxFrame <= 0 {
		c.MaxFrame = DefaultMaxFrame
	}
	c.MaxFrame = min(c.MaxFrame, maxFrameLimit)
	if c.MaxBufferedBytes <= 0 {
		c.MaxBufferedBytes = DefaultMaxBuffered
	}
	c.MaxBufferedBytes = max(c.MaxBufferedBytes, int64(c.MaxFrame))
	if c.MaxCallsPerConn <= 0 {
		c.MaxCallsPerConn = DefaultMaxCallsPerConn
	}
	if c.MaxCalls <= 0 {
		c.MaxCalls = DefaultMaxCalls
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.FrameTimeout <= 0 {
		c.FrameTimeout = DefaultFrameTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.Conns.Name == "" {
		c.Conns.Name = "crpc"
	}
	return c
}

type method struct {
	name   string // "/service/method"
	srv    any
	h      grpc.MethodHandler
	inline func() bool // ServerConfig.Inline's check; nil: never
}

// Server serves registered services' unary methods. Register services
// before Serve.
type Server struct {
	cfg     ServerConfig
	methods map[string]*method
	slots   chan struct{}  // calls in flight, server-wide
	mem     *budget.Budget // request bytes held, server-wide

	mu       sync.Mutex
	loops    map[*netx.Loop]bool
	conns    map[*serverConn]bool
	stopped  bool
	draining bool
	bgWG     sync.WaitGroup // GracefulStop's listener shutdowns
	callWG   sync.WaitGroup // handlers running
}

var _ grpc.ServiceRegistrar = (*Server)(nil)

// NewServer returns a server with no services.
func NewServer(cfg ServerConfig) *Server {
	cfg = cfg.withDefaults()
	return &Server{cfg: cfg, methods: map[string]*method{}, slots: make(chan struct{}, cfg.MaxCalls), mem: budget.New(cfg.MaxBufferedBytes),
		loops: map[*netx.Loop]bool{}, conns: map[*serverConn]bool{}}
}

// RegisterService implements grpc.ServiceRegistrar (unary methods only).
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, m := range desc.Methods {
		name := "/" + desc.ServiceName + "/" + m.MethodName
		var inline func() bool
		if s.cfg.Inline != nil {
			inline = s.cfg.Inline(name)
		}
		s.methods[name] = &method{name: name, srv: impl, h: m.Handler, inline: inline}
	}
}

// Serve accepts connections on lis (through netx.Serve: transient accept
// errors back off) until Stop or GracefulStop (then it returns
// ErrServerStopped) or lis fails.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.stopped || s.draining {
		s.mu.Unlock()
		lis.Close()
		return ErrServerStopped
	}
	l := netx.Serve(lis, s.cfg.Conns, s.serveConn)
	s.loops[l] = true
	s.mu.Unlock()
	<-l.Done()
	s.mu.Lock()
	done := s.stopped || s.draining
	s.mu.Unlock()
	if done {
		return ErrServerStopped
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("crpc: accept: %w", err)
	}
	return fmt.Errorf("crpc: accept: %w", net.ErrClosed)
}

// Stop closes the listeners and every connection at once, and waits for
// running handlers.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopped = true
	loops, conns := s.loops, s.conns
	s.loops, s.conns = map[*netx.Loop]bool{}, map[*serverConn]bool{}
	s.mu.Unlock()
	for sc := range conns {
		sc.close()
	}
	for l := range loops {
		l.Close()
	}
	s.callWG.Wait()
	s.bgWG.Wait()
}

// GracefulStop stops accepting, lets the calls in progress finish and
// answer, then closes the connections.
func (s *Server) GracefulStop() {
	s.mu.Lock()
	s.draining = true
	for l := range s.loops {
		s.bgWG.Add(1)
		go func() {
			defer s.bgWG.Done()
			l.Shutdown(true) // returns once Stop has closed the connections
		}()
	}
	s.mu.Unlock()
	s.callWG.Wait()
	s.Stop()
}

// busyMarker is a netx.Conn, possibly under Split's wrapper.
type busyMarker interface {
	Busy()
	Idle()
}

type serverConn struct {
	s      *Server
	c      net.Conn   // the stream: nc, or TLS over it
	nc     *netx.Conn // for the caps' busy marks
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan struct{} // calls in flight on this connection
	once   sync.Once

	// Writes: one writer at a time; frames that come meanwhile queue
	// and go out together in its next write (one syscall for many
	// replies). A queued frame's caller waits until its batch is out.
	wmu     sync.Mutex
	wcond   sync.Cond // on wmu: a batch went out, or writing failed
	writing bool
	wq      []byte // frames queued for the next batch
	spare   []byte // the last batch's buffer, for reuse
	fill    uint64 // the batch wq fills
	sent    uint64 // the last batch written
	werr    error

	// Reading: one reader at a time. The connection's own goroutine
	// (serveConn's) reads first; a call running on the reader that
	// Detaches hands reading to a new goroutine (readLoop).
	rd            *reader
	frameDeadline time.Time     // of the frame being read; zero: none
	readDone      chan struct{} // closed when reading has ended for good

	mu    sync.Mutex
	calls map[uint32]*serverCall
}

// serverCall is one call, and its handler's context: a child of the
// connection's context that ends at the call's deadline, when the client
// cancels or when the call returns. The context.Context the package
// would make (a timer, an entry in the connection context's children, a
// value layer: six allocations per call) is made only when the handler
// asks for something only it can give (Done, AfterFunc, a cancelCtx
// lookup); a handler that answers at once uses none of it.
type serverCall struct {
	sc       *serverConn
	deadline time.Time // zero: none
	canceled bool      // by the client: no reply wanted (under sc.mu)
	// Of a call run on the reader (ServerConfig.Inline): onReader while
	// the reader runs it, detached once it has handed reading on, done
	// once the reader has taken reading back.
	state atomic.Int32

	mu   sync.Mutex
	err  error              // once the call's context has ended (before real exists)
	real context.Context    // made by the first Done, AfterFunc or cancelCtx lookup
	stop context.CancelFunc // real's
}

func (c *serverCall) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

// Done is real's: the first call makes it.
func (c *serverCall) Done() <-chan struct{} { return c.ctx().Done() }

// Err answers without making real when it can: the call ended or its
// connection did, or the deadline passed. The first error seen stays.
func (c *serverCall) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.real != nil {
		return c.real.Err()
	}
	if c.err == nil {
		if err := c.sc.ctx.Err(); err != nil {
			c.err = err
		} else if !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
			c.err = context.DeadlineExceeded
		}
	}
	return c.err
}

// Value finds the call for Detach; the context package looks up its own
// key (a *int) to find the cancelCtx to hang children and causes on,
// which must be real's, not the connection's.
func (c *serverCall) Value(key any) any {
	switch key.(type) {
	case callKey:
		return c
	case *int:
		return c.ctx().Value(key)
	}
	return c.sc.ctx.Value(key)
}

// AfterFunc lets context.AfterFunc and WithCancel children hang on real
// without a goroutine each.
func (c *serverCall) AfterFunc(f func()) func() bool { return context.AfterFunc(c.ctx(), f) }

// ctx makes real once; when the call's context has already ended, real
// ends at once with the same error.
func (c *serverCall) ctx() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.real == nil {
		if c.deadline.IsZero() || c.err == context.Canceled {
			c.real, c.stop = context.WithCancel(c.sc.ctx)
		} else {
			c.real, c.stop = context.WithDeadline(c.sc.ctx, c.deadline)
		}
		if c.err != nil {
			c.stop()
		}
	}
	return c.real
}

// cancel ends the call's context (the client cancelled, or it returned).
func (c *serverCall) cancel() {
	c.mu.Lock()
	if c.real == nil && c.err == nil {
		c.err = context.Canceled
	}
	stop := c.stop
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
}

const (
	onReader int32 = iota + 1
	detached
	finished
)

type callKey struct{}

// Detach tells the server that the handler of ctx's call is about to
// wait (for a disk, a lease, another call): when the call runs on its
// connection's reader (ServerConfig.Inline), the connection gets a new
// reader so its other calls go on meanwhile. A handler calls it from its
// own goroutine; elsewhere (gRPC, a call with a goroutine of its own, a
// second time) it does nothing.
func Detach(ctx context.Context) {
	c, _ := ctx.Value(callKey{}).(*serverCall)
	if c == nil || !c.state.CompareAndSwap(onReader, detached) {
		return
	}
	go c.sc.readLoop()
}

func (sc *serverConn) close() {
	sc.once.Do(func() {
		sc.cancel()
		sc.nc.Close() // first: TLS's close alert must not wait on the peer
		sc.c.Close()
	})
}

// busy marks the connection (and Split's, beneath) as working or not, so
// netx evicts only idle connections at its caps.
func (sc *serverConn) busy(on bool) {
	under, _ := sc.nc.Conn.(busyMarker)
	if on {
		sc.nc.Busy()
		if under != nil {
			under.Busy()
		}
		return
	}
	sc.nc.Idle()
	if under != nil {
		under.Idle()
	}
}

func (s *Server) serveConn(raw *netx.Conn) {
	var nc net.Conn = raw
	if pc, ok := raw.Conn.(*peekedConn); s.cfg.TLS != nil && (!ok || !pc.secure) {
		tc, ok := handshake(raw, s.cfg.TLS)
		if !ok {
			raw.Close()
			return
		}
		nc = tc
	}
	sc := &serverConn{s: s, c: nc, nc: raw, slots: make(chan struct{}, s.cfg.MaxCallsPerConn), calls: map[uint32]*serverCall{}, fill: 1,
		readDone: make(chan struct{})}
	sc.wcond.L = &sc.wmu
	sc.ctx, sc.cancel = context.WithCancel(context.Background())
	defer sc.close()
	p := make([]byte, prefaceLen)
	nc.SetReadDeadline(time.Now().Add(prefaceTimeout))
	if _, err := io.ReadFull(nc, p); err != nil || checkPreface(p) != nil {
		// Answer a wrong version with ours, so the client can say why.
		if err == nil && string(p[:4]) == magic {
			nc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
			nc.Write(preface())
		}
		return
	}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.conns[sc] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
	}()
	if sc.write(preface()) != nil {
		return
	}
	sc.rd = newReader(nc, s.cfg.MaxFrame)
	rd := sc.rd
	// Deadlines are armed only before a read that may wait: a frame
	// already buffered needs none (time.Now and a timer update per frame
	// add up at small calls).
	rd.onHeader = func(whole bool) {
		if whole {
			sc.frameDeadline = time.Time{}
			return
		}
		sc.frameDeadline = time.Now().Add(s.cfg.FrameTimeout)
		nc.SetReadDeadline(sc.frameDeadline)
	}
	rd.reserve = func(n int) error {
		if s.mem.TryAcquire(int64(n)) {
			return nil
		}
		if sc.frameDeadline.IsZero() {
			sc.frameDeadline = time.Now().Add(s.cfg.FrameTimeout)
		}
		ctx, cancel := context.WithDeadline(sc.ctx, sc.frameDeadline)
		defer cancel()
		return s.mem.Acquire(ctx, int64(n))
	}
	rd.release = func(n int) { s.mem.Release(int64(n)) }
	sc.readLoop()
	// This goroutine holds the connection (netx counts it until
	// serveConn returns) while another reads after a Detach.
	<-sc.readDone
}

// readLoop reads and dispatches frames until the connection ends (then it
// closes it and readDone) or a call it runs inline Detaches (then the
// reading goes on in another readLoop and this one returns once that
// call has answered).
func (sc *serverConn) readLoop() {
	s, rd, nc := sc.s, sc.rd, sc.c
	ended := true
	defer func() {
		if ended {
			sc.close()
			close(sc.readDone)
		}
	}()
	for {
		if rd.buffered() < headerLen {
			nc.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		}
		f, err := rd.next()
		if err != nil {
			return
		}
		if f.kind != kindRequest && f.held > 0 {
			s.mem.Release(int64(f.held))
		}
		switch f.kind {
		case kindPing:
			if sc.write(control(f.id, kindPong)) != nil {
				return
			}
		case kindCancel:
			sc.mu.Lock()
			if c := sc.calls[f.id]; c != nil {
				c.canceled = true
				c.cancel()
			}
			sc.mu.Unlock()
		case kindRequest:
			timeout, name, msg, err := parseRequest(f.body)
			if err != nil {
				s.mem.Release(int64(f.held))
				return
			}
			m := s.methods[string(name)] // no copy of name for the lookup
			if m == nil {
				m = &method{name: string(name)}
			}
			ok, gone := sc.admit(f.id, timeout, m, msg, f.held)
			if !ok {
				return
			}
			if gone {
				ended = false // a Detach handed reading on
				return
			}
		default:
			return // a reply or an error from a client
		}
	}
}

// admit starts a call once a slot is free on the connection and in the
// server (the connection is not read meanwhile): on a goroutine of its
// own, or here when its method is inline. ok is false when the
// connection ended while waiting; gone when an inline call Detached (the
// caller no longer reads).
func (sc *serverConn) admit(id uint32, timeout time.Duration, m *method, msg []byte, held int) (ok, gone bool) {
	s := sc.s
	select {
	case sc.slots <- struct{}{}:
	case <-sc.ctx.Done():
		s.mem.Release(int64(held))
		return false, false
	}
	select {
	case s.slots <- struct{}{}:
	case <-sc.ctx.Done():
		<-sc.slots
		s.mem.Release(int64(held))
		return false, false
	}
	s.mu.Lock()
	if s.stopped || s.draining {
		s.mu.Unlock()
		<-s.slots
		<-sc.slots
		s.mem.Release(int64(held))
		// Calls in progress still answer on this connection.
		return sc.reply(id, nil, status.Error(codes.Unavailable, "crpc: server stopping")) == nil, false
	}
	s.callWG.Add(1)
	s.mu.Unlock()
	c := &serverCall{sc: sc}
	if timeout > 0 {
		c.deadline = time.Now().Add(timeout)
	}
	sc.mu.Lock()
	if len(sc.calls) == 0 {
		sc.busy(true)
	}
	sc.calls[id] = c
	sc.mu.Unlock()
	if m.inline == nil || !m.inline() {
		go sc.call(c, id, m, msg, held)
		return true, false
	}
	c.state.Store(onReader)
	sc.call(c, id, m, msg, held)
	return true, !c.state.CompareAndSwap(onReader, finished)
}

// call runs one handler and answers.
func (sc *serverConn) call(c *serverCall, id uint32, m *method, msg []byte, held int) {
	s := sc.s
	defer s.callWG.Done()
	var resp any
	var err error
	if m.h == nil {
		err = status.Errorf(codes.Unimplemented, "crpc: unknown method %s", m.name)
	} else {
		dec := func(v any) error {
			pm, ok := v.(proto.Message)
			if !ok {
				return status.Errorf(codes.Internal, "crpc: %T is not a protobuf message", v)
			}
			if err := pbcodec.UnmarshalRequest(msg, pm); err != nil {
				return status.Errorf(codes.InvalidArgument, "crpc: decoding %s: %v", m.name, err)
			}
			return nil
		}
		resp, err = m.h(m.srv, c, dec, s.cfg.Interceptor)
	}
	sc.mu.Lock()
	canceled := c.canceled
	if sc.calls[id] == c {
		delete(sc.calls, id)
	}
	if len(sc.calls) == 0 {
		sc.busy(false)
	}
	sc.mu.Unlock()
	c.cancel()
	if !canceled {
		sc.reply(id, resp, err)
	}
	// The slots free after the reply is out: a peer that does not read
	// its replies holds them.
	s.mem.Release(int64(held))
	<-s.slots
	<-sc.slots
}

// reply sends a handler's outcome: the response, or a status when the
// handler failed or the response cannot be sent.
func (sc *serverConn) reply(id uint32, resp any, err error) error {
	bp := replyBufs.Get().(*[]byte)
	buf, err := encodeReply((*bp)[:0], id, resp, err, sc.s.cfg.MaxFrame)
	if err != nil {
		buf, _ = encodeReply((*bp)[:0], id, nil, err, sc.s.cfg.MaxFrame)
	}
	werr := sc.write(buf)
	// write keeps no reference to the frame once it returns (a queued
	// frame is copied), so the buffer serves the next reply.
	if cap(buf) <= maxPooledReply {
		*bp = buf[:0]
		replyBufs.Put(bp)
	}
	return werr
}

// replyBufs recycles reply frames up to maxPooledReply bytes (a batch
// reply of a few hundred items); larger ones go to the GC.
var replyBufs = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledReply = 64 << 10

// maxCoalesce is the largest frame write queues behind another write;
// a larger one waits its turn and goes out alone (no copy).
const maxCoalesce = 64 << 10

// write sends one frame, each write within WriteTimeout, else ends the
// connection; it returns once the frame is out. Frames written while
// another write is in progress queue and leave together in the next one.
func (sc *serverConn) write(b []byte) error {
	sc.wmu.Lock()
	for sc.writing && len(b) > maxCoalesce && sc.werr == nil {
		sc.wcond.Wait()
	}
	if sc.werr != nil {
		err := sc.werr
		sc.wmu.Unlock()
		return err
	}
	if sc.writing {
		sc.wq = append(sc.wq, b...)
		mine := sc.fill
		for sc.sent < mine && sc.werr == nil {
			sc.wcond.Wait()
		}
		var err error
		if sc.sent < mine {
			err = sc.werr
		}
		sc.wmu.Unlock()
		return err
	}
	sc.writing = true
	batch := uint64(0) // b is the caller's frame, not a batch
	for {
		sc.wmu.Unlock()
		sc.c.SetWriteDeadline(time.Now().Add(sc.s.cfg.WriteTimeout))
		_, err := sc.c.Write(b)
		sc.wmu.Lock()
		if batch != 0 {
			if cap(b) <= 4*maxCoalesce { // keep a small buffer only
				sc.spare = b[:0]
			}
			if err == nil {
				sc.sent = batch
			}
		}
		if err != nil {
			sc.werr, sc.writing, sc.wq = err, false, nil
			sc.wcond.Broadcast()
			sc.wmu.Unlock()
			sc.close()
			return err
		}
		if len(sc.wq) == 0 {
			sc.writing = false
			sc.wcond.Broadcast() // a large frame may be waiting
			sc.wmu.Unlock()
			return nil
		}
		sc.wcond.Broadcast()
		batch = sc.fill
		sc.fill++
		b, sc.wq, sc.spare = sc.wq, sc.spare, nil
	}
}

// handshake runs a server TLS handshake on c within the preface timeout.
// A plaintext crpc client is answered, in plaintext, with the preface
// that says TLS is required, so it can tell its caller why.
func handshake(c net.Conn, cfg *tls.Config) (*tls.Conn, bool) {
	c.SetDeadline(time.Now().Add(prefaceTimeout))
	tc := tls.Server(c, cfg)
	err := tc.Handshake()
	if err != nil {
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) && rh.Conn != nil && string(rh.RecordHeader[:4]) == magic {
			rh.Conn.Write(tlsRequiredPreface())
		}
		return nil, false
	}
	c.SetDeadline(time.Time{})
	return tc, true
}

// encodeReply frames resp (kind reply), or herr's status when herr is not
// nil (kind error), appended to buf (empty; its capacity is reused); it
// fails when resp is not a protobuf message, does not encode or exceeds
// max.
func encodeReply(buf []byte, id uint32, resp any, herr error, max int) ([]byte, error) {
	var msg proto.Message
	kind := byte(kindReply)
	if herr != nil {
		msg, kind = status.Convert(herr).Proto(), kindError
	} else if pm, ok := resp.(proto.Message); ok {
		msg = pm
	} else {
		return nil, status.Errorf(codes.Internal, "crpc: reply %T is not a protobuf message", resp)
	}
	n := pbcodec.Size(msg)
	if n > max {
		return nil, status.Errorf(codes.ResourceExhausted, "crpc: %d-byte reply > %d", n, max)
	}
	// The size just computed is cached in the messages: the marshal does
	// not walk them again to size them (a batch reply's items dominate).
	buf = slices.Grow(buf[:0], headerLen+n)[:headerLen]
	buf, err := pbcodec.AppendSized(buf, msg, n)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "crpc: encoding the reply: %v", err)
	}
	if err := putHeader(buf, id, kind, max); err != nil {
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	}
	return buf, nil
}
