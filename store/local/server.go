package local

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

// Defaults of Options.
const (
	DefaultBlockSize          = 16 << 20
	DefaultAdmissionThreshold = 2
	DefaultPingInterval       = time.Second
	DefaultExpireAfter        = 10 * time.Second
	DefaultRecvTimeout        = 5 * time.Second
	DefaultFillQueue          = 64
	DefaultMaxDummies         = 256
	// maxInflight bounds the requests of one dummy served at once; the
	// read loop waits for a slot (backpressure, bounded memory).
	maxInflight = 64
	// maxViews bounds the views one dummy holds unreleased (each pins a
	// cache block and a map entry): a full window of batch GetBuffers.
	maxViews = maxInflight * maxBatch
	// leaseMargin: a cached block is served without asking the master
	// only while its read lease has at least this much left.
	leaseMargin = 100 * time.Millisecond
)

// Options configures a Server. The zero value serves with no hot cache.
type Options struct {
	// CacheSize is the hot cache's size in bytes (0: no cache); rounded
	// down to whole blocks.
	CacheSize int64
	// BlockSize is the cache's block size (default 16 MiB): the largest
	// value it holds.
	BlockSize int64
	// Shm shares the cache with dummies (its memfd is passed at
	// registration), so a hit is a zero-copy view.
	Shm bool
	// AdmissionThreshold is how many misses of a key (counted by the
	// frequency sketch) admit it to the cache (default 2).
	AdmissionThreshold int
	// AllowUIDs are peer uids accepted besides this process's own.
	AllowUIDs []uint32
	// SocketMode is the socket file's permission bits (default 0600);
	// SO_PEERCRED and the token decide in any case.
	SocketMode os.FileMode
	// PingInterval is how often dummies ping (default 1 s); ExpireAfter
	// is the silence after which a dummy is dropped with its mappings
	// and references (default 10 s); RecvTimeout bounds the arrival of a
	// frame once its first byte came (default 5 s).
	PingInterval, ExpireAfter, RecvTimeout time.Duration
	// FillQueue bounds the asynchronous cache fills waiting (default 64;
	// fills beyond it are dropped).
	FillQueue int
	// MaxDummies bounds connected dummies (default 256).
	MaxDummies int
	// Logger gets dummies registering, leaving and misbehaving; nil =
	// slog.Default(), so the application's slog setup applies.
	Logger *slog.Logger
}

func (o *Options) setDefaults() error {
	o.BlockSize = cmp.Or(o.BlockSize, DefaultBlockSize)
	o.AdmissionThreshold = cmp.Or(o.AdmissionThreshold, DefaultAdmissionThreshold)
	o.PingInterval = cmp.Or(o.PingInterval, DefaultPingInterval)
	o.ExpireAfter = cmp.Or(o.ExpireAfter, DefaultExpireAfter)
	o.RecvTimeout = cmp.Or(o.RecvTimeout, DefaultRecvTimeout)
	o.FillQueue = cmp.Or(o.FillQueue, DefaultFillQueue)
	o.MaxDummies = cmp.Or(o.MaxDummies, DefaultMaxDummies)
	o.SocketMode = cmp.Or(o.SocketMode, 0o600)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.CacheSize < 0 || o.BlockSize < 0 || o.BlockSize > MaxInline:
		return fmt.Errorf("local: cache size %d, block size %d (at most %d)", o.CacheSize, o.BlockSize, MaxInline)
	case o.CacheSize > 0 && o.CacheSize < o.BlockSize:
		return fmt.Errorf("local: cache size %d below one block of %d", o.CacheSize, o.BlockSize)
	case o.AdmissionThreshold < 0 || o.PingInterval < 0 || o.ExpireAfter <= o.PingInterval || o.RecvTimeout < 0 || o.FillQueue < 0:
		return fmt.Errorf("local: invalid options (threshold %d, ping %v, expire %v)", o.AdmissionThreshold, o.PingInterval, o.ExpireAfter)
	}
	return nil
}

// Server serves dummies on a Unix socket for one store.Client (the real
// client); see the package documentation.
type Server struct {
	c    *store.Client
	opts Options
	path string
	loop *netx.Loop
	hot  *cache // nil without a cache
	// watch is the hot cache's invalidation subscription (nil without a
	// cache): a block is served without the master only while it is fresh.
	watch *store.InvalidationWatch
	uid   uint32

	fillq    chan fillTask
	fillStop chan struct{}
	fillWG   sync.WaitGroup

	mu       sync.Mutex
	sessions map[*session]struct{}
	closed   bool

	st serverStats
}

type fillTask struct {
	key string
	tok uint64
}

// Serve listens on the Unix socket path (an old socket file there is
// replaced) and serves dummies for c until Close.
func Serve(c *store.Client, path string, opts Options) (*Server, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("local: %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("local: %s is in use by another server", path)
		}
		os.Remove(path) // left by a server that died
	}
	s := &Server{c: c, opts: opts, path: path, uid: uint32(os.Getuid()), sessions: map[*session]struct{}{},
		fillq: make(chan fillTask, opts.FillQueue), fillStop: make(chan struct{})}
	s.st.lat = newLatency()
	if opts.CacheSize > 0 {
		hot, err := newCache(opts.CacheSize, opts.BlockSize, opts.AdmissionThreshold)
		if err != nil {
			return nil, err
		}
		s.hot = hot
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		s.closeCache()
		return nil, fmt.Errorf("local: listen: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	if err := os.Chmod(path, opts.SocketMode); err != nil {
		ln.Close()
		s.closeCache()
		return nil, fmt.Errorf("local: chmod socket: %w", err)
	}
	if s.hot != nil {
		s.watch = c.WatchInvalidations(s.hot)
		// Hits need a fresh subscription; give the first answer a moment
		// (without one the cache only misses until it comes).
		wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := s.watch.WaitFresh(wctx); err != nil {
			opts.Logger.Warn("local: hot cache: no invalidation subscription yet; serving no hits until it answers", "err", err)
		}
		cancel()
		s.fillWG.Add(1)
		go s.fillLoop()
	}
	s.loop = netx.Serve(ln, netx.Config{Name: "local socket", MaxConns: opts.MaxDummies, Logger: opts.Logger}, s.handle)
	return s, nil
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Close stops serving: every dummy is disconnected and its references
// dropped; the cache is unmapped.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	err := s.loop.Close() // closes every connection and waits for the handlers
	close(s.fillStop)
	s.fillWG.Wait()
	if s.watch != nil {
		s.watch.Close()
	}
	s.closeCache()
	return err
}

func (s *Server) closeCache() {
	if s.hot != nil {
		s.hot.close()
	}
}

// session is one registered dummy.
type session struct {
	s      *Server
	nc     *netx.Conn
	f      *fconn
	tok    token
	pid    int32
	uid    uint32
	wmu    sync.Mutex
	wg     sync.WaitGroup
	sem    chan struct{}
	mu     sync.Mutex
	regs   map[uint32]*region
	nextR  uint32
	views  map[uint64]*block
	blocks map[*block]int // views held per block: the dummy's share of the cache
	nextV  uint64
	closed bool
}

// region is a dummy's buffer mapped here.
type region struct {
	m    *mempool.Mapping
	mem  []byte
	regd bool // registered with the engine
	refs int  // requests using it
	gone bool // unregistered: unmap when refs reach 0
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, cerr
}

func (s *Server) allowed(uid uint32) bool {
	return uid == s.uid || slices.Contains(s.opts.AllowUIDs, uid)
}

func (s *Server) handle(nc *netx.Conn) {
	uc, ok := nc.Conn.(*net.UnixConn)
	if !ok {
		return
	}
	f := newFconn(uc)
	defer f.closeFDs()
	cred, err := peerCred(uc)
	if err != nil {
		s.opts.Logger.Warn("local: SO_PEERCRED failed", "err", err)
		return
	}
	ss := &session{s: s, nc: nc, f: f, pid: cred.Pid, uid: cred.Uid, sem: make(chan struct{}, maxInflight),
		regs: map[uint32]*region{}, views: map[uint64]*block{}, blocks: map[*block]int{}}
	// A peer not yet allowed may claim no more than a Hello's few bytes.
	h, body, err := f.readMax(s.opts.RecvTimeout, s.opts.RecvTimeout, helloFrame)
	if err != nil || h.op != opHello {
		s.st.refused.Add(1)
		if errors.Is(err, ErrProtocol) && h.op == opHello && h.n > helloFrame {
			s.opts.Logger.Warn("local: dummy refused: oversized hello", "pid", cred.Pid, "uid", cred.Uid, "bytes", h.n)
			ss.replyErr(h, errcode.New(errcode.InvalidParams, "hello frame of %d bytes (limit %d)", h.n, helloFrame))
		}
		return
	}
	d := dec{b: body}
	ver := d.u32()
	if err := d.done(); err != nil || ver != protoVersion {
		s.st.refused.Add(1) // counted before the dummy hears of it
		ss.replyErr(h, errcode.New(errcode.InvalidVersion, "local protocol version %d, this server speaks %d", ver, protoVersion))
		return
	}
	if !s.allowed(cred.Uid) {
		s.opts.Logger.Warn("local: dummy refused: uid not allowed", "uid", cred.Uid, "pid", cred.Pid)
		s.st.refused.Add(1)
		ss.replyErr(h, errcode.New(errcode.IllegalClient, "uid %d may not use this real client (it runs as uid %d)", cred.Uid, s.uid))
		return
	}
	if _, err := rand.Read(ss.tok[:]); err != nil {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.sessions[ss] = struct{}{}
	s.mu.Unlock()
	s.st.dummies.Add(1)
	defer func() {
		s.mu.Lock()
		delete(s.sessions, ss)
		s.mu.Unlock()
		s.st.dummies.Add(-1)
		ss.end()
	}()

	e := newEnc(opHello, h.id, token{})
	e.b = append(e.b, ss.tok[:]...)
	e.u32(uint32(s.opts.PingInterval / time.Millisecond))
	e.u32(uint32(s.opts.ExpireAfter / time.Millisecond))
	fd := -1
	if s.hot != nil && s.opts.Shm {
		e.u64(uint64(s.hot.pool.Size()))
		e.u64(uint64(s.hot.blockSize))
		fd = s.hot.pool.Fd()
	} else {
		e.u64(0)
		e.u64(0)
	}
	if err := ss.send(e.frame(stOK), fd); err != nil {
		return
	}
	s.opts.Logger.Info("local: dummy registered", "pid", cred.Pid, "uid", cred.Uid)
	ss.loop()
}

func (ss *session) send(b []byte, fd int) error {
	ss.wmu.Lock()
	defer ss.wmu.Unlock()
	ss.f.c.SetWriteDeadline(time.Now().Add(ss.s.opts.RecvTimeout))
	err := ss.f.write(b, fd)
	if err != nil {
		ss.f.c.Close() // a partial frame leaves the stream unusable
	}
	return err
}

func (ss *session) replyErr(h header, err error) {
	e := newEnc(h.op, h.id, token{})
	e.err(err)
	ss.send(e.frame(stErr), -1)
}

// loop reads requests until the dummy goes away, falls silent for
// ExpireAfter, or breaks the protocol.
func (ss *session) loop() {
	o := ss.s.opts
	for {
		ss.nc.Idle()
		h, body, err := ss.f.read(o.ExpireAfter, o.RecvTimeout)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				ss.s.st.expired.Add(1)
				o.Logger.Warn("local: dummy expired or stalled mid-frame", "pid", ss.pid, "err", err)
			} else if errors.Is(err, ErrProtocol) {
				o.Logger.Warn("local: dummy broke the protocol", "pid", ss.pid, "err", err)
			}
			return
		}
		ss.nc.Busy()
		if subtle.ConstantTimeCompare(h.tok[:], ss.tok[:]) != 1 {
			ss.s.st.badToken.Add(1)
			o.Logger.Warn("local: request with a wrong token; disconnecting", "pid", ss.pid)
			ss.replyErr(h, errcode.New(errcode.IllegalClient, "wrong registration token"))
			return
		}
		switch h.op {
		case opPing:
			if h.id != 0 {
				ss.send(newEnc(opPing, h.id, token{}).frame(stOK), -1)
			}
			continue
		case opRelease:
			if err := ss.release(body); err != nil {
				ss.replyErr(h, err)
				return
			}
			continue
		case opRegister:
			fd := ss.f.claimFD()
			ss.reply(h, ss.register(body, fd))
			continue
		case opHello:
			ss.replyErr(h, errcode.New(errcode.InvalidParams, "already registered"))
			continue
		}
		ss.sem <- struct{}{}
		ss.wg.Add(1)
		go func() {
			defer func() { <-ss.sem; ss.wg.Done() }()
			start := time.Now()
			ss.reply(h, ss.serve(h.op, body))
			ss.s.st.lat.observe(time.Since(start))
		}()
	}
}

// reply sends a handler's result: its encoder, or an error.
func (ss *session) reply(h header, r result) {
	if h.id == 0 {
		return
	}
	if r.err != nil {
		ss.replyErr(h, r.err)
		return
	}
	e := r.e
	if e == nil {
		e = newEnc(h.op, h.id, token{})
	} else {
		hd := header{op: h.op, id: h.id}
		hd.put(e.b)
	}
	ss.send(e.frame(stOK), -1)
}

type result struct {
	e   *enc
	err error
}

// end drops everything the dummy held: views, mappings, registrations.
func (ss *session) end() {
	ss.wg.Wait()
	ss.mu.Lock()
	ss.closed = true
	views := ss.views
	ss.views = map[uint64]*block{}
	clear(ss.blocks)
	regs := ss.regs
	ss.regs = map[uint32]*region{}
	ss.mu.Unlock()
	for _, b := range views {
		ss.s.hot.release(b)
	}
	for _, r := range regs {
		ss.s.dropRegion(r)
	}
	ss.s.opts.Logger.Info("local: dummy gone", "pid", ss.pid, "views", len(views), "regions", len(regs))
}

func (s *Server) dropRegion(r *region) {
	if r.regd {
		s.c.UnregisterBuffer(r.mem)
	}
	r.m.Close()
}

// register maps a dummy's buffer (a memfd sealed against shrinking, so
// the dummy cannot make our accesses fault) and registers it with the
// engine so transfers move straight to and from it.
func (ss *session) register(body []byte, fd int) result {
	if fd < 0 {
		return result{err: errcode.New(errcode.InvalidParams, "register: no descriptor came with the request")}
	}
	defer unix.Close(fd)
	d := dec{b: body}
	size := d.u64()
	if err := d.done(); err != nil {
		return result{err: err}
	}
	if size == 0 || size > 1<<40 {
		return result{err: errcode.New(errcode.InvalidParams, "register: buffer of %d bytes", size)}
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return result{err: errcode.New(errcode.InvalidParams, "register: descriptor is not a memfd sealed against shrinking (seals %#x, %v)", seals, err)}
	}
	m, err := mempool.Map(fd, int64(size), mempool.MapOptions{})
	if err != nil {
		return result{err: errcode.New(errcode.InvalidParams, "register: %v", err)}
	}
	r := &region{m: m, mem: m.Bytes()}
	r.regd = ss.s.c.RegisterBuffer(r.mem) == nil // else moved through staging
	ss.mu.Lock()
	if len(ss.regs) >= maxRegions || ss.closed {
		ss.mu.Unlock()
		ss.s.dropRegion(r)
		return result{err: errcode.New(errcode.InvalidParams, "register: at most %d buffers per dummy", maxRegions)}
	}
	ss.nextR++
	id := ss.nextR
	ss.regs[id] = r
	ss.mu.Unlock()
	e := newEnc(opRegister, 0, token{})
	e.u32(id)
	return result{e: e}
}

func (ss *session) unregister(body []byte) result {
	d := dec{b: body}
	id := d.u32()
	if err := d.done(); err != nil {
		return result{err: err}
	}
	ss.mu.Lock()
	r := ss.regs[id]
	delete(ss.regs, id)
	drop := false
	if r != nil {
		r.gone = true
		drop = r.refs == 0
	}
	ss.mu.Unlock()
	if r == nil {
		return result{err: errcode.New(errcode.InvalidParams, "unregister: no buffer %d", id)}
	}
	if drop {
		ss.s.dropRegion(r)
	}
	return result{}
}

// span resolves a region reference, checking offset+size against the
// region; the region stays mapped until put is called.
func (ss *session) span(d *dec) (b []byte, put func(), err error) {
	id, off, n := d.u32(), d.u64(), d.u64()
	if d.err != nil {
		return nil, nil, d.err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	r := ss.regs[id]
	if r == nil {
		return nil, nil, errcode.New(errcode.InvalidParams, "no registered buffer %d", id)
	}
	size := uint64(len(r.mem))
	if off > size || n > size-off {
		return nil, nil, errcode.New(errcode.InvalidParams, "range [%d, +%d) outside buffer %d of %d bytes", off, n, id, size)
	}
	r.refs++
	return r.mem[off : off+n : off+n], func() {
		ss.mu.Lock()
		r.refs--
		drop := r.refs == 0 && r.gone
		ss.mu.Unlock()
		if drop {
			ss.s.dropRegion(r)
		}
	}, nil
}

// value reads a value reference: inline bytes or a registered span.
func (ss *session) value(d *dec) ([]byte, func(), error) {
	switch k := d.u8(); k {
	case refNone:
		return d.blob(MaxInline, "value"), func() {}, d.err
	case refRegion:
		return ss.span(d)
	default:
		if d.err != nil {
			return nil, nil, d.err
		}
		return nil, nil, fmt.Errorf("%w: value kind %d", ErrProtocol, k)
	}
}

// release drops views: handles the dummy no longer uses.
func (ss *session) release(body []byte) error {
	d := dec{b: body}
	n := d.count()
	var bs []*block
	ss.mu.Lock()
	for range n {
		hd := d.u64()
		if d.err != nil {
			break
		}
		if b := ss.views[hd]; b != nil {
			delete(ss.views, hd)
			ss.unholdLocked(b)
			bs = append(bs, b)
		}
	}
	ss.mu.Unlock()
	for _, b := range bs {
		ss.s.hot.release(b)
	}
	return d.done()
}

// hold records a view handed to the dummy: ErrClosed when the session
// ended, NO_AVAILABLE_HANDLE when it holds maxViews already, errShare
// when b would be one block more than share (the caller answers with a
// copy instead).
func (ss *session) hold(b *block, share int) (uint64, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return 0, ErrClosed
	}
	if len(ss.views) >= maxViews {
		return 0, errViews()
	}
	if ss.blocks[b] == 0 && len(ss.blocks) >= share {
		return 0, errShare
	}
	ss.blocks[b]++
	ss.nextV++
	ss.views[ss.nextV] = b
	return ss.nextV, nil
}

func (ss *session) unholdLocked(b *block) {
	if ss.blocks[b]--; ss.blocks[b] <= 0 {
		delete(ss.blocks, b)
	}
}

// blockShare is how many cache blocks one dummy may hold views of: an
// equal part of the blocks for each registered dummy (at least one), so
// no dummy can pin the whole cache while others are served copies.
func (s *Server) blockShare() int {
	return max(1, len(s.hot.blocks)/max(1, int(s.st.dummies.Load())))
}

func errViews() error {
	return errcode.New(errcode.NoAvailableHandle, "%d views held: release some first", maxViews)
}

// Dummies is the number of registered dummies.
func (s *Server) Dummies() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// ctx is the context of one request: bounded by the RPC timeout the
// store client applies, and by Close.
func (ss *session) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}
