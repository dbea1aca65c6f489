package shm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/netx"
)

// Config tunes the shared-memory transport.
type Config struct {
	// AllowUIDs lists the peer uids allowed besides our own.
	AllowUIDs []uint32
	// AllowAnyUID lets any local user map shared buffers.
	AllowAnyUID bool
	// RevokeTimeout bounds how long unregistering waits for each peer to
	// confirm it unmapped a buffer (default 5s).
	RevokeTimeout time.Duration
	// RetryAfter is how long a peer that could not be reached over shm is
	// left to other transports before trying again (default 5s).
	RetryAfter time.Duration
	// NoPrefault skips populating page tables when mapping a peer's
	// buffers.
	NoPrefault bool
	// MaxConns caps live control connections (default 1024; negative: no
	// cap). At the cap a connection that has sent nothing yet is closed to
	// make room; when none is, new peers wait in the accept queue.
	MaxConns int
	// Token, when set, authenticates each control connection once
	// (auth.Client and auth.Server, PurposeShmControl), on top of the uid
	// check, before any message is served: peers must hold the same
	// token.
	Token []byte
}

// ErrPermission reports a peer whose uid is not allowed.
var ErrPermission = errors.New("shm: peer uid not allowed")

// Transport copies directly between local memory and a same-host peer's
// registered buffers, mapped from memfds the peer hands over.
type Transport struct {
	cfg  Config
	env  transport.Env
	log  *slog.Logger
	loop *netx.Loop
	path string
	uid  uint32

	mu     sync.Mutex
	conns  map[*serverConn]struct{}
	peers  map[string]*peer
	hidden map[*transport.Region]struct{} // being unregistered: never listed again
	closed bool
	wg     sync.WaitGroup
	nextID atomic.Uint64
}

var _ transport.Transport = (*Transport)(nil)

// New returns a shared-memory transport.
func New(cfg Config) *Transport {
	if cfg.RevokeTimeout <= 0 {
		cfg.RevokeTimeout = 5 * time.Second
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 5 * time.Second
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 1024
	}
	return &Transport{cfg: cfg, conns: make(map[*serverConn]struct{}), peers: make(map[string]*peer), hidden: make(map[*transport.Region]struct{}), uid: uint32(os.Getuid())}
}

// Name implements transport.Transport.
func (t *Transport) Name() string { return "shm" }

// Start listens on an abstract Unix socket.
func (t *Transport) Start(env transport.Env) error {
	t.env, t.log = env, env.Logger
	if t.log == nil {
		t.log = slog.Default()
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	t.path = fmt.Sprintf("@crescent/shm/%d/%s", os.Getpid(), hex.EncodeToString(rnd[:]))
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: t.path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("shm: listen: %w", err)
	}
	// Every peer is on this host: no per-host cap.
	t.loop = netx.Serve(ln, netx.Config{MaxConns: t.cfg.MaxConns, MaxConnsPerHost: -1,
		IdleGrace: idleGrace, Name: "shm server", Logger: t.log}, t.serve)
	return nil
}

// Describe implements transport.Transport.
func (t *Transport) Describe(d *metadata.SegmentDesc) {
	if d.Crescent == nil {
		d.Crescent = &metadata.Extension{Version: 1, HostID: t.env.HostID}
	}
	d.Crescent.ShmSocket = t.path
	d.Crescent.ShmBuffers = d.Crescent.ShmBuffers[:0]
	for _, r := range t.env.Registry.Regions() {
		if r.Shareable() {
			d.Crescent.ShmBuffers = append(d.Crescent.ShmBuffers, r.Addr)
		}
	}
}

// Accepts implements transport.Transport: a same-host peer whose target
// buffer is shareable and mapped (mapping it on first use).
func (t *Transport) Accepts(p transport.Peer, addr, length uint64) bool {
	d := p.Desc()
	if d == nil || d.Crescent == nil || d.Crescent.ShmSocket == "" || d.Crescent.HostID != t.env.HostID {
		return false
	}
	pr := t.peer(p.Name(), d.Crescent.ShmSocket)
	if pr == nil {
		return false
	}
	if pr.covers(addr, length) {
		return true
	}
	// The target may have registered the buffer after we listed its
	// regions: list again if it says the buffer is shareable.
	if !shareable(d, addr, length) {
		return false
	}
	if err := pr.list(); err != nil {
		return false
	}
	return pr.covers(addr, length)
}

// shareable reports whether the descriptor lists the buffer holding
// [addr, addr+length) as mappable.
func shareable(d *metadata.SegmentDesc, addr, length uint64) bool {
	for _, b := range d.Buffers {
		if addr >= b.Addr && length <= b.Length && addr-b.Addr <= b.Length-length {
			return slices.Contains(d.Crescent.ShmBuffers, b.Addr)
		}
	}
	return false
}

// peer returns the connected peer state, connecting on first use; nil if
// the peer cannot be reached now.
func (t *Transport) peer(name, path string) *peer {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	pr := t.peers[name]
	if pr != nil && pr.path == path {
		t.mu.Unlock()
		return pr.ready()
	}
	if pr != nil {
		// The peer restarted on another socket: drop the old one in the
		// background (Close waits).
		delete(t.peers, name)
		old := pr
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			old.close()
		}()
	}
	pr = newPeer(t, name, path)
	t.peers[name] = pr
	t.mu.Unlock()
	pr.connectOnce()
	return pr.ready()
}

// Submit implements transport.Transport. Copies run inline: the caller's
// goroutine is the copy engine, as for a local memcpy.
func (t *Transport) Submit(p transport.Peer, tasks []*transport.Task) {
	t.mu.Lock()
	pr := t.peers[p.Name()]
	t.mu.Unlock()
	if pr == nil {
		for _, tk := range tasks {
			tk.Complete(0, fmt.Errorf("%w: %s", transport.ErrUnreachable, p.Name()))
		}
		return
	}
	pr.copy(tasks)
}

// ClosePeer implements transport.Transport.
func (t *Transport) ClosePeer(name string) {
	t.mu.Lock()
	pr := t.peers[name]
	delete(t.peers, name)
	t.mu.Unlock()
	if pr != nil {
		pr.close()
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
		err = t.loop.Close() // closes the control connections, waits for them
	}
	for _, pr := range peers {
		pr.close()
	}
	t.wg.Wait()
	return err
}

// BeforeUnregister implements transport.Unregisterer: every connected
// peer unmaps the buffer (waiting for its copies in progress) and
// confirms before the memory is withdrawn.
func (t *Transport) BeforeUnregister(ctx context.Context, addr, length uint64) error {
	reg := t.env.Registry
	t.mu.Lock()
	// Stop listing the buffer first: until the engine removes it, a peer
	// that lists again must not map it again.
	for r := range t.hidden {
		if cur, ok := reg.Find(r.Addr, r.Len()); !ok || cur != r {
			delete(t.hidden, r) // removed since
		}
	}
	for _, r := range reg.Regions() {
		if r.Addr < addr+length && addr < r.End() {
			t.hidden[r] = struct{}{}
		}
	}
	conns := make([]*serverConn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, t.cfg.RevokeTimeout)
	defer cancel()
	// All peers at once: a silent one must not use up the others' time.
	errs := make([]error, len(conns))
	gone := make([]<-chan struct{}, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gone[i], errs[i] = c.revoke(ctx, t.nextID.Add(1), addr, length)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		ue := &transport.UnconfirmedError{Err: err}
		for _, ch := range gone {
			if ch != nil {
				ue.Released = append(ue.Released, ch)
			}
		}
		return ue
	}
	return nil
}

// listable returns the registered regions peers may map now.
func (t *Transport) listable() []*transport.Region {
	regs := t.env.Registry.Regions()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.hidden) == 0 {
		return regs
	}
	out := make([]*transport.Region, 0, len(regs))
	for _, r := range regs {
		if _, ok := t.hidden[r]; !ok {
			out = append(out, r)
		}
	}
	return out
}

// seal stops a peer from shrinking or growing a shared memfd under its
// owner (a shrink would fault the owner's accesses). It fails quietly for
// memfds created without MFD_ALLOW_SEALING.
func seal(fd int) {
	unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
}
