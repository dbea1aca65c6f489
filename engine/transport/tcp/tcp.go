package tcp

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/netx"
)

// Config tunes the TCP transport. Zero values take the defaults.
type Config struct {
	// Port is the data port; 0 picks a free one.
	Port int
	// Lanes is the number of persistent connections per peer (default 4).
	Lanes int
	// SliceSize splits larger requests into slices spread over the lanes
	// (default 1 MiB).
	SliceSize int
	// Window bounds slices in flight per lane (default 64).
	Window int
	// SocketBuffer sets SO_SNDBUF/SO_RCVBUF (forced past the sysctl limits
	// when allowed); 0 keeps the kernel's autotuning.
	SocketBuffer int
	// DialTimeout bounds connection set-up (default 5s).
	DialTimeout time.Duration
	// IdleTimeout bounds how long the server waits for one request's bytes
	// once its header arrived (default 60s).
	IdleTimeout time.Duration
	// Retries is how often a slice whose connection broke is sent again
	// on a new connection (default 1). A slice the target rejected is
	// never retried.
	Retries int
	// ForceV1 speaks the unacknowledged framing even to v2 peers.
	ForceV1 bool
	// MaxConns caps live connections to the data port (default 4096;
	// negative: no cap). At the cap the connection idle longest (between
	// requests) is closed to make room; when none is idle, new peers wait
	// in the accept queue.
	MaxConns int
	// MaxConnsPerHost caps live connections from one IP (default 1024;
	// negative: no cap): that host's idlest connection is closed, or the
	// new one refused when all are busy.
	MaxConnsPerHost int
	// Token, when set, authenticates each lane once (auth.Client and
	// auth.Server, PurposeTCPLane) before any header moves: peers must
	// hold the same token. A connection that fails is closed unserved.
	Token []byte
	// Allow, when set, admits peers to the data port by address
	// (netx.Config.Allow; the engine's protected default).
	Allow func(net.Addr) bool
}

func (c *Config) setDefaults() {
	if c.Lanes <= 0 {
		c.Lanes = 4
	}
	if c.SliceSize <= 0 {
		c.SliceSize = 1 << 20
	}
	if c.Window <= 0 {
		c.Window = 64
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 60 * time.Second
	}
	if c.MaxConns == 0 {
		c.MaxConns = 4096
	}
	if c.MaxConnsPerHost == 0 {
		c.MaxConnsPerHost = 1024
	}
	if c.Retries < 0 {
		c.Retries = 0
	} else if c.Retries == 0 {
		c.Retries = 1
	}
}

// Transport is the TCP transport: a data port serving the reference's
// framing, and pipelined persistent lanes to each peer.
type Transport struct {
	cfg  Config
	env  transport.Env
	log  *slog.Logger
	loop *netx.Loop

	mu     sync.Mutex
	peers  map[string]*peer
	closed bool
	wg     sync.WaitGroup

	bytesIn, bytesOut, rejected, authFailed atomic.Uint64
}

var _ transport.Transport = (*Transport)(nil)

// New returns a TCP transport; Start opens its port.
func New(cfg Config) *Transport {
	cfg.setDefaults()
	return &Transport{cfg: cfg, peers: make(map[string]*peer)}
}

// Name implements transport.Transport.
func (t *Transport) Name() string { return "tcp" }

// Start listens on the data port.
func (t *Transport) Start(env transport.Env) error {
	t.env, t.log = env, env.Logger
	if t.log == nil {
		t.log = slog.Default()
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(env.Host, strconv.Itoa(t.cfg.Port)))
	if err != nil {
		return fmt.Errorf("tcp: listen: %w", err)
	}
	t.loop = netx.Serve(ln, netx.Config{MaxConns: t.cfg.MaxConns, MaxConnsPerHost: t.cfg.MaxConnsPerHost,
		IdleGrace: idleGrace, Name: "tcp data port", Logger: t.log, Allow: t.cfg.Allow}, t.serveConn)
	return nil
}

// idleGrace spares a connection accepted a moment ago from eviction at
// the cap before its first header could arrive.
const idleGrace = 250 * time.Millisecond

// Port is the data port.
func (t *Transport) Port() int { return t.loop.Addr().(*net.TCPAddr).Port }

// Describe implements transport.Transport.
func (t *Transport) Describe(d *metadata.SegmentDesc) {
	d.TCPDataPort = t.Port()
	d.TCPProtoVersion = 2
	d.TCPDataHost = t.env.Host
}

// Accepts implements transport.Transport: any peer with a data port.
func (t *Transport) Accepts(p transport.Peer, addr, length uint64) bool {
	d := p.Desc()
	return d != nil && d.TCPDataPort > 0 && d.TCPDataPort <= 65535
}

// tune sets TCP_NODELAY and, when asked, large socket buffers.
func (t *Transport) tune(c *net.TCPConn) {
	c.SetNoDelay(true)
	if n := t.cfg.SocketBuffer; n > 0 {
		rc, err := c.SyscallConn()
		if err != nil {
			return
		}
		rc.Control(func(fd uintptr) {
			// The FORCE variants pass net.core.[rw]mem_max when we may;
			// otherwise the plain ones are capped by the kernel.
			if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, n) != nil {
				syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, n)
			}
			if syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, n) != nil {
				syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, n)
			}
		})
	}
}

// dataAddr is where a peer's data port listens: tcp_data_host if set,
// else the host of its segment name, as the reference does.
func dataAddr(d *metadata.SegmentDesc) (string, error) {
	host := d.TCPDataHost
	if host == "" {
		h, _, err := net.SplitHostPort(d.Name)
		if err != nil {
			return "", fmt.Errorf("tcp: segment name %q has no host: %w", d.Name, err)
		}
		host = h
	}
	return net.JoinHostPort(host, strconv.Itoa(d.TCPDataPort)), nil
}

// Submit implements transport.Transport.
func (t *Transport) Submit(p transport.Peer, tasks []*transport.Task) {
	pr, err := t.peer(p)
	if err != nil {
		for _, tk := range tasks {
			tk.Complete(0, err)
		}
		return
	}
	pr.submit(tasks)
}

func (t *Transport) peer(p transport.Peer) (*peer, error) {
	d := p.Desc()
	addr, err := dataAddr(d)
	if err != nil {
		return nil, err
	}
	v2 := d.TCPProtoVersion >= 2 && !t.cfg.ForceV1
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, transport.ErrClosed
	}
	pr := t.peers[p.Name()]
	if pr == nil || pr.addr != addr || pr.v2 != v2 {
		if pr != nil {
			// The peer restarted on another port or protocol version:
			// drain the old connections in the background (Close waits).
			old := pr
			t.wg.Add(1)
			go func() {
				defer t.wg.Done()
				old.close(transport.ErrPeerGone)
			}()
		}
		pr = newPeer(t, addr, v2)
		t.peers[p.Name()] = pr
	}
	return pr, nil
}

// ClosePeer implements transport.Transport.
func (t *Transport) ClosePeer(name string) {
	t.mu.Lock()
	pr := t.peers[name]
	delete(t.peers, name)
	t.mu.Unlock()
	if pr != nil {
		pr.close(transport.ErrClosed)
	}
}

// Close implements transport.Transport.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	peers := t.peers
	t.peers = map[string]*peer{}
	t.mu.Unlock()
	var err error
	if t.loop != nil {
		err = t.loop.Close()
	}
	for _, pr := range peers {
		pr.close(transport.ErrClosed)
	}
	t.wg.Wait()
	return err
}

// Stats are the transport's cumulative counters.
type Stats struct {
	ServerBytesIn, ServerBytesOut, Rejected uint64
	// AuthFailed counts connections closed for failing authentication.
	AuthFailed uint64
}

// Stats returns the server-side counters.
func (t *Transport) Stats() Stats {
	return Stats{ServerBytesIn: t.bytesIn.Load(), ServerBytesOut: t.bytesOut.Load(), Rejected: t.rejected.Load(), AuthFailed: t.authFailed.Load()}
}
