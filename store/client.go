package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// Defaults of Config.
const (
	DefaultMasterAddr        = "127.0.0.1:50051"
	DefaultLocalBufferSize   = 256 << 20
	DefaultHeartbeatInterval = time.Second
	DefaultRPCTimeout        = 10 * time.Second
	DefaultMaxKeyLen         = 4096
	DefaultPutRetries        = 2
	DefaultClusterID         = "crescent"
)

// Config configures a Client. Only MasterAddr matters for a pure client on
// this host; the zero value of every other field takes its default.
type Config struct {
	// MasterAddr is the master's address (default 127.0.0.1:50051):
	// host:port for one master, or, for masters in high availability,
	// where the leader view lives: "etcd://h:p[,h2:p2]" or
	// "redis://[user:pass@]h:p[/db]" (schemes registered by importing
	// store/haview). The client then follows the leader (ha.go).
	MasterAddr string
	// ClusterID names the HA cluster whose leader view the client follows
	// (default "crescent", crescent-master's --cluster_id default);
	// ignored for a host:port MasterAddr.
	ClusterID string
	// MasterProtocol is how to talk to the master: "crpc" (the master
	// service over internal/crpc's light framing, on the same port),
	// "grpc", or "auto" (default): crpc when the master answers it, else
	// gRPC.
	MasterProtocol string
	// MasterDialer, when set, opens the master connection instead of
	// DialMaster (another RPC layer, e.g. the bench's drpc); intercept
	// must see every call (the client's RPC counters). MasterProtocol is
	// then only the name the client reports.
	MasterDialer func(ctx context.Context, addr string, intercept grpc.UnaryClientInterceptor) (MasterConn, error)
	// MasterPollWait, when positive, makes a call waiting for the
	// master's crpc reply wait up to this long in its own thread (ppoll)
	// before it parks in Go's netpoller (crpc.WithPollWait; plain TCP
	// only). It pays for callers on locked OS threads, such as calls
	// from C or Python through the C ABI (which sets 200us), and costs
	// Go callers; 0 (default): off.
	MasterPollWait time.Duration
	// TokenFile holds the cluster token (the master's --token_file): each
	// connection to the master proves it, and so does every connection of
	// the engine the client starts (not a Config.Engine). Empty: none.
	TokenFile string
	// TLSCA verifies the master's certificate (empty: system roots, when
	// TLS is on); TLSCert and TLSKey are this client's, for a master that
	// verifies clients (mTLS). Any of them turns TLS on.
	TLSCA, TLSCert, TLSKey string
	// AdminTokenFile holds the master's admin token (its
	// --admin_token_file), for RemoveAll, RemoveByRegex and forced
	// removes. Empty: none.
	AdminTokenFile string
	// Security, when any of its fields is set, is used instead of loading
	// TokenFile, AdminTokenFile and the TLS files.
	Security Security
	// EngineInsecure and MooncakeCompat are engine.Config's switches for
	// the engine the client starts (not a Config.Engine): without a
	// token, its ports open to any address, unauthenticated.
	EngineInsecure, MooncakeCompat bool
	// LocalHostname is the engine's LocalServerName ("host" or
	// "host:port"; default: the engine's choice).
	LocalHostname string
	// GlobalSegmentSize is the memory contributed to the pool, mounted as
	// one segment (0 = pure client).
	GlobalSegmentSize int64
	// LocalBufferSize is the staging pool for values in unregistered
	// memory and for GetBuffer (default 256 MiB).
	LocalBufferSize int64
	// AllowOvercommit creates the segment and staging pool even when they
	// exceed the memory available (mempool.Options.AllowOvercommit).
	AllowOvercommit bool
	// Protocols are the engine's transports in order of preference
	// (empty: the engine's default, shm, cxl, rdma, efa, tcp, each
	// skipped where it cannot start). Unknown names fail New.
	Protocols []string
	// MetadataServer is the engine's metadata connection string (default
	// P2PHANDSHAKE); other schemes need their backend imported, as for
	// engine.Config.MetadataServer.
	MetadataServer string
	// HeartbeatInterval between Pings while a segment is mounted
	// (default 1 s).
	HeartbeatInterval time.Duration
	// RPCTimeout bounds each call to the master (default 10 s).
	RPCTimeout time.Duration
	// MaxKeyLen refuses longer keys before any RPC (default 4096, the
	// master's default; negative leaves the check to the master).
	MaxKeyLen int
	// PutAhead is how many reservations the client keeps for each value
	// size it puts repeatedly, so such puts take one master round trip
	// instead of two (ahead.go; default 8, negative disables). A size
	// whose concurrent puts outnumber them gets one more for each put
	// that found none, up to 256.
	PutAhead int
	// PutAheadBytes bounds the pool memory those reservations hold, in
	// all sizes (default 64 MiB): the bound that always holds.
	PutAheadBytes int64
	// PutRetries is how many times a put whose write to a segment failed
	// (its client died, say) is placed again: the client reports the
	// segment to the master, which places new replicas elsewhere until
	// that segment's client pings again (default 2; negative: never).
	// Retries stay within the caller's context.
	PutRetries int
	// LocationCache, when positive, caches where up to that many objects
	// are (loccache.go), so a get of a key read recently asks the master
	// nothing: it is used within the first three quarters of its read
	// lease and while the client's invalidation subscription (which it
	// then runs) is fresh; any remove, eviction or loss of the key drops
	// it first. Default 0: every get asks the master.
	LocationCache int
	// Engine, when set, is used instead of starting one; the client
	// neither configures nor closes it (LocalHostname, Protocols and
	// MetadataServer are then ignored).
	Engine *engine.Engine
	// Logger: nil = slog.Default(), so the application's slog setup applies.
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	c.MasterAddr = cmp.Or(c.MasterAddr, DefaultMasterAddr)
	c.MasterProtocol = cmp.Or(c.MasterProtocol, "auto") // DialMaster checks it
	c.ClusterID = cmp.Or(c.ClusterID, DefaultClusterID)
	if !strings.Contains(c.MasterAddr, "://") {
		if _, _, err := net.SplitHostPort(c.MasterAddr); err != nil {
			return fmt.Errorf("%w: master address %q: %w", ErrInvalidConfig, c.MasterAddr, err)
		}
	}
	if c.GlobalSegmentSize < 0 {
		return fmt.Errorf("%w: global segment size %d", ErrInvalidConfig, c.GlobalSegmentSize)
	}
	if c.LocalBufferSize < 0 {
		return fmt.Errorf("%w: local buffer size %d", ErrInvalidConfig, c.LocalBufferSize)
	}
	c.LocalBufferSize = cmp.Or(c.LocalBufferSize, DefaultLocalBufferSize)
	if c.HeartbeatInterval < 0 || c.RPCTimeout < 0 {
		return fmt.Errorf("%w: negative interval", ErrInvalidConfig)
	}
	if c.Security.Token == nil && c.Security.TLS == nil && c.Security.Admin == nil {
		sec, err := LoadSecurity(c.TokenFile, c.AdminTokenFile, auth.TLSFiles{CA: c.TLSCA, Cert: c.TLSCert, Key: c.TLSKey})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		c.Security = sec
	}
	if c.MasterPollWait < 0 {
		return fmt.Errorf("%w: master poll wait %v", ErrInvalidConfig, c.MasterPollWait)
	}
	c.Security.pollWait = c.MasterPollWait
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.RPCTimeout = cmp.Or(c.RPCTimeout, DefaultRPCTimeout)
	c.MaxKeyLen = cmp.Or(c.MaxKeyLen, DefaultMaxKeyLen)
	c.PutAhead = cmp.Or(c.PutAhead, DefaultPutAhead)
	if c.PutAheadBytes < 0 {
		return fmt.Errorf("%w: put-ahead bytes %d", ErrInvalidConfig, c.PutAheadBytes)
	}
	c.PutAheadBytes = cmp.Or(c.PutAheadBytes, DefaultPutAheadBytes)
	c.PutRetries = cmp.Or(c.PutRetries, DefaultPutRetries)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Client is a store client. All methods are safe for concurrent use.
type Client struct {
	cfg      Config
	id       UUID
	session  []byte // proves id to the master (auth.ClientID)
	log      *slog.Logger
	conn     MasterConn
	ha       *haConn // nil unless MasterAddr is etcd:// or redis://
	rpcProto string
	master   storepb.MasterClient
	eng      *engine.Engine
	ownEng   bool
	name     string // engine segment name
	host     string // host part of name, to rank same-host replicas
	clock    clock.Clock
	stats    *stats
	regs     regions
	stage    *stager
	segs     atomic.Pointer[[]*segment] // copy on write (mount.go)
	retired  []*segment                 // unmounted, maybe still in use by calls (mountMu)
	drained  []*segment                 // unmounted, used by no call; unmapped at views == 0 (mountMu)
	mountMu  sync.Mutex                 // serializes Mount, Unmount, remount

	segMu  sync.Mutex
	segIDs map[string]engine.SegmentID

	// Concurrent single-key calls share batch RPCs (coalesce.go).
	putStarts *coalescer[putStartQ, putStarted]
	putEnds   *coalescer[putEndQ, struct{}]
	gets      *coalescer[string, getResult]
	commits   *coalescer[commitQ, struct{}]

	ahead     *putAhead // nil when disabled
	aheadStop context.CancelFunc

	loc      *locCache          // nil unless Config.LocationCache > 0
	locWatch *InvalidationWatch // the invalidations loc follows

	bufMu  sync.Mutex
	bufs   [][]byte // RegisterBuffer'd buffers still registered
	views  int      // Buffers not yet released
	memOff bool     // Close has withdrawn the memory; unmap at views == 0

	life   sync.RWMutex // held shared by calls in progress, exclusively by Close
	closed atomic.Bool

	hbMu   sync.Mutex
	hbStop context.CancelFunc // nil while no heartbeat runs
	hbDone chan struct{}      // closed when that heartbeat loop exits
	hbNow  chan struct{}      // beat now (after a leader switch)
	viewV  atomic.Uint64

	// Test hooks.
	afterRead   func()      // runs after a Get's read, before the lease check
	hbPaused    atomic.Bool // skip heartbeats
	beforeWrite func()      // runs after PutStart, before the replicas are written
}

// New connects to the master, starts the engine and mounts the
// contributed memory. ctx bounds the start-up RPCs.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	c := newClient(cfg)
	ok := false
	defer func() {
		if !ok {
			c.teardown()
		}
	}()

	if cfg.PutAhead > 0 {
		// Before connect: an HA switch may come at once and drop them.
		c.ahead = newPutAhead(cfg.PutAhead, cfg.PutAheadBytes)
	}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	c.startCoalescers()
	if cfg.LocationCache > 0 {
		c.loc = newLocCache(cfg.LocationCache)
		c.locWatch = c.WatchInvalidations(c.loc)
	}
	if c.ahead != nil {
		var actx context.Context
		actx, c.aheadStop = context.WithCancel(context.Background())
		c.ahead.wg.Add(1)
		go c.aheadLoop(actx)
	}
	if err := c.startMemory(); err != nil {
		return nil, err
	}
	if cfg.GlobalSegmentSize == 0 {
		// A pure client sends no heartbeat; check the master answers.
		rctx, cancel := c.rpcCtx(ctx)
		_, err := c.master.ServiceReady(rctx, &storepb.ServiceReadyRequest{})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("store: master %s: %w", metadata.Redact(cfg.MasterAddr), rpcerr.FromStatus(err))
		}
		ok = true
		return c, nil
	}
	if _, err := c.mountNew(ctx, cfg.GlobalSegmentSize); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// connect opens the master connection: crpc or gRPC (Config.MasterProtocol),
// to the one master or, in HA, to the leader the view names.
func (c *Client) connect(ctx context.Context) error {
	open, isHA, err := leaderOpener(c.cfg.MasterAddr)
	if err != nil {
		return err
	}
	if isHA {
		return c.connectHA(ctx, open)
	}
	var conn MasterConn
	proto := c.cfg.MasterProtocol
	if c.cfg.MasterDialer != nil {
		conn, err = c.cfg.MasterDialer(ctx, c.cfg.MasterAddr, c.stats.interceptor)
	} else {
		conn, proto, err = dialMaster(ctx, c.cfg.MasterAddr, c.cfg.MasterProtocol, c.stats.interceptor, c.cfg.Security, c.cfg.RPCTimeout)
	}
	if err != nil {
		return err
	}
	c.log.Debug("master connection", "addr", c.cfg.MasterAddr, "protocol", proto)
	c.conn, c.master, c.rpcProto = conn, storepb.NewMasterClient(conn), proto
	return nil
}

// MasterProtocol is the protocol the client talks to the master with:
// "crpc" or "grpc" ("auto" until a master not reachable at start answers).
func (c *Client) MasterProtocol() string {
	if p, ok := c.conn.(interface{ Protocol() string }); ok {
		return p.Protocol()
	}
	return c.rpcProto
}

func newClient(cfg Config) *Client {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// The id is derived from the session, which only this client and each
	// call carry: nobody who reads the id can act as the client.
	sess, hi, lo := auth.NewSession()
	c := &Client{cfg: cfg, id: UUID{hi, lo}, session: sess, clock: clock.Real{}, stats: newStats(), segIDs: make(map[string]engine.SegmentID),
		hbNow: make(chan struct{}, 1)}
	c.log = cfg.Logger.With("client", c.id.String())
	return c
}

// startMemory starts (or adopts) the engine and registers the staging
// pool with it.
func (c *Client) startMemory() error {
	var err error
	if c.cfg.Engine != nil {
		c.eng = c.cfg.Engine
	} else {
		c.eng, err = engine.New(engine.Config{
			LocalServerName: c.cfg.LocalHostname, MetadataServer: c.cfg.MetadataServer,
			Protocols: c.cfg.Protocols, Logger: c.cfg.Logger, Notifications: engine.NotifyOff,
			Token:    c.cfg.Security.Token, // one cluster credential: the master's port and the engines'
			Insecure: c.cfg.EngineInsecure, MooncakeCompat: c.cfg.MooncakeCompat,
		})
		if err != nil {
			return fmt.Errorf("store: start engine: %w", err)
		}
		c.ownEng = true
	}
	c.name = c.eng.Name()
	c.host, _, _ = net.SplitHostPort(c.name)
	c.stage, err = newStager(c.cfg.LocalBufferSize, c.cfg.AllowOvercommit)
	if err != nil {
		return err
	}
	if err := c.eng.RegisterMemory(c.stage.mem, "*"); err != nil {
		c.stage.pool.Close()
		c.stage = nil
		return fmt.Errorf("store: register staging pool: %w", err)
	}
	c.regs.add(c.stage.mem)
	return nil
}

func (s *segment) pb() *storepb.Segment {
	return &storepb.Segment{Id: s.info.ID.pb(), Name: s.info.Name, Base: s.info.Base, Size: s.info.Size, Protocol: s.info.Protocol}
}

// rpcCtx bounds one RPC by RPCTimeout (or ctx's earlier deadline). A
// master connection that bounds each call by RPCTimeout itself (crpc,
// and auto or HA connections settled on crpc: crpc.WithCallTimeout)
// spares every call a timer and a context.
func (c *Client) rpcCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.selfTimed() {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, c.cfg.RPCTimeout)
}

// selfTimed reports whether the master connection bounds each call by
// RPCTimeout now.
func (c *Client) selfTimed() bool {
	b, ok := c.conn.(callBounder)
	return ok && b.CallTimeout() == c.cfg.RPCTimeout
}

func noCancel() {}

// enter admits a call unless the client is closed; leave must follow.
func (c *Client) enter() error {
	c.life.RLock()
	if c.closed.Load() {
		c.life.RUnlock()
		return ErrClosed
	}
	return nil
}

func (c *Client) leave() { c.life.RUnlock() }

func (c *Client) heartbeatLoop(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(c.cfg.HeartbeatInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.hbNow:
		}
		if c.hbPaused.Load() {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, min(c.cfg.RPCTimeout, 2*c.cfg.HeartbeatInterval+time.Second))
		err := c.heartbeat(pctx)
		cancel()
		// Log changes of state, not every beat of an outage.
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			c.log.Warn("heartbeat failed; retrying every interval", "err", err)
			failing = true
		case err == nil && failing:
			c.log.Info("heartbeat answered again")
			failing = false
		}
	}
}

// heartbeat sends one Ping and re-mounts on NEED_REMOUNT.
func (c *Client) heartbeat(ctx context.Context) error {
	c.stats.heartbeats.Add(1)
	resp, err := c.master.Ping(ctx, &storepb.PingRequest{ClientId: c.id.pb(), Session: c.session})
	if err != nil {
		c.stats.heartbeatFail.Add(1)
		return rpcerr.FromStatus(err)
	}
	if old := c.viewV.Swap(resp.ViewVersion); old != 0 && old != resp.ViewVersion {
		c.log.Info("master view changed", "old", old, "new", resp.ViewVersion)
	}
	if resp.ClientStatus != storepb.ClientStatus_CLIENT_STATUS_NEED_REMOUNT {
		return nil
	}
	return c.remount(ctx)
}

// remount mounts every segment again, after the master forgot them.
func (c *Client) remount(ctx context.Context) error {
	c.mountMu.Lock() // not interleaved with an Unmount's
	defer c.mountMu.Unlock()
	req := &storepb.ReMountSegmentRequest{ClientId: c.id.pb(), Session: c.session}
	for _, s := range c.segList() {
		req.Segments = append(req.Segments, s.pb())
	}
	if len(req.Segments) == 0 {
		return nil
	}
	if _, err := c.master.ReMountSegment(ctx, req); err != nil {
		return fmt.Errorf("store: remount: %w", rpcerr.FromStatus(err))
	}
	c.stats.remounts.Add(1)
	c.log.Info("segments re-mounted after NEED_REMOUNT", "segments", len(req.Segments))
	return nil
}

// ID returns the client's UUID, the owner of its puts on the master.
func (c *Client) ID() UUID { return c.id }

// SegmentName returns the engine segment name of this client, the name
// its mounted segments carry (for ReplicateConfig.Preferred).
func (c *Client) SegmentName() string { return c.name }

// Engine returns the transfer engine the client uses.
func (c *Client) Engine() *engine.Engine { return c.eng }

// Segments describes the segments this client mounted.
func (c *Client) Segments() []SegmentInfo {
	segs := c.segList()
	out := make([]SegmentInfo, len(segs))
	for i, s := range segs {
		out[i] = s.info
	}
	return out
}

// SegmentStatus asks the master about a segment (any client's).
func (c *Client) SegmentStatus(ctx context.Context, id UUID) (SegmentStatus, error) {
	if err := c.enter(); err != nil {
		return SegmentStatus{}, err
	}
	defer c.leave()
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	r, err := c.master.QuerySegmentStatus(rctx, &storepb.QuerySegmentStatusRequest{SegmentId: id.pb()})
	if err != nil {
		return SegmentStatus{}, rpcerr.FromStatus(err)
	}
	return SegmentStatus{Status: r.Status, Name: r.Name, Capacity: r.Capacity, Used: r.Used}, nil
}

// Ready checks that the master answers (ServiceReady), for health checks.
func (c *Client) Ready(ctx context.Context) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	_, err := c.master.ServiceReady(rctx, &storepb.ServiceReadyRequest{})
	return rpcerr.FromStatus(err)
}

// Stats returns a snapshot of the client's counters.
func (c *Client) Stats() Stats {
	s := c.stats.snapshot()
	for _, seg := range c.segList() {
		s.SegmentBytes += seg.info.Size
	}
	if c.ha != nil {
		v := c.ha.View()
		s.Leader, s.LeaderVersion = v.Leader, v.Version
		s.LeaderSwitches, s.StaleLeaderViews, s.LeaderRetries = c.ha.switches.Load(), c.ha.ignored.Load(), c.ha.retries.Load()
	}
	if c.stage != nil {
		s.StagingBytes = uint64(len(c.stage.mem))
	}
	return s
}

// RegisterBuffer registers b with the engine so PutFrom and GetInto move
// its bytes with no copy. b must stay mapped and must not move until
// UnregisterBuffer: memory from engine/mempool (or another mmap), never a
// Go heap slice the collector may free.
func (c *Client) RegisterBuffer(b []byte) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	if len(b) == 0 {
		return errcode.New(errcode.InvalidParams, "register an empty buffer")
	}
	if err := c.eng.RegisterMemory(b, "*"); err != nil {
		return fmt.Errorf("%w: %w", errcode.ErrInvalidParams, err)
	}
	c.regs.add(b)
	c.bufMu.Lock()
	c.bufs = append(c.bufs, b)
	c.bufMu.Unlock()
	return nil
}

// UnregisterBuffer withdraws a buffer given to RegisterBuffer, waiting
// for transfers that still touch it.
func (c *Client) UnregisterBuffer(b []byte) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	c.bufMu.Lock()
	idx := -1
	for i, x := range c.bufs {
		if spanOf(x) == spanOf(b) {
			idx = i
			break
		}
	}
	if idx < 0 {
		c.bufMu.Unlock()
		return errcode.New(errcode.InvalidParams, "buffer [%#x,+%d) not registered through this client", spanOf(b).addr, len(b))
	}
	c.bufs = append(c.bufs[:idx], c.bufs[idx+1:]...)
	c.bufMu.Unlock()
	c.regs.remove(b)
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RPCTimeout)
	defer cancel()
	if err := c.eng.UnregisterMemory(ctx, b); err != nil {
		return fmt.Errorf("store: unregister buffer: %w", err)
	}
	return nil
}

// Close unmounts the client's segments, stops heartbeats, withdraws its
// memory from the engine and releases it (after the last Buffer is
// released), closes the engine it started and the master connection. It
// waits for calls in progress.
func (c *Client) Close() error {
	c.life.Lock()
	if c.closed.Swap(true) {
		c.life.Unlock()
		return nil
	}
	c.life.Unlock()
	return c.teardown()
}

// teardown releases whatever New set up, in reverse order.
func (c *Client) teardown() error {
	var errs []error
	if c.locWatch != nil {
		c.locWatch.Close()
	}
	// Reservations go back while the master connection is up.
	c.closeAhead()
	// Heartbeats stop first: a Ping after the unmount could be told
	// NEED_REMOUNT and mount the segments again.
	c.stopHeartbeat()
	for _, s := range c.segList() {
		if !s.mounted {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RPCTimeout)
		_, err := c.master.UnmountSegment(ctx, &storepb.UnmountSegmentRequest{ClientId: c.id.pb(), Session: c.session, SegmentId: s.info.ID.pb()})
		cancel()
		if err != nil && !errors.Is(rpcerr.FromStatus(err), errcode.ErrSegmentNotFound) {
			errs = append(errs, fmt.Errorf("store: unmount segment %s: %w", s.info.ID, rpcerr.FromStatus(err)))
		}
	}
	if c.eng != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RPCTimeout)
		for _, s := range c.segList() {
			if err := c.eng.UnregisterMemory(ctx, s.mem); err != nil && !errors.Is(err, engine.ErrClosed) {
				errs = append(errs, err)
			}
		}
		if c.stage != nil {
			if err := c.eng.UnregisterMemory(ctx, c.stage.mem); err != nil && !errors.Is(err, engine.ErrClosed) && !errors.Is(err, engine.ErrNotRegistered) {
				errs = append(errs, err)
			}
		}
		c.bufMu.Lock()
		bufs := c.bufs
		c.bufs = nil
		c.bufMu.Unlock()
		for _, b := range bufs {
			c.eng.UnregisterMemory(ctx, b) // the caller's memory: only withdraw it
		}
		cancel()
		if c.ownEng {
			if err := c.eng.Close(); err != nil {
				errs = append(errs, err)
			}
		} else {
			c.segMu.Lock()
			for _, id := range c.segIDs {
				c.eng.CloseSegment(id)
			}
			c.segIDs = map[string]engine.SegmentID{}
			c.segMu.Unlock()
		}
	}
	c.bufMu.Lock()
	c.memOff = true
	free := c.views == 0
	c.bufMu.Unlock()
	if free {
		c.unmapMemory()
	}
	if c.conn != nil {
		if err := c.conn.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// unmapMemory closes the pools once nothing can touch them.
func (c *Client) unmapMemory() {
	c.mountMu.Lock()
	defer c.mountMu.Unlock()
	for _, s := range slices.Concat(c.segList(), c.retired, c.drained) {
		s.pool.Close()
	}
	if c.stage != nil {
		c.stage.pool.Close()
	}
}
