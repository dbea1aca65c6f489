package zmtp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/crescent-kv/crescent/internal/netx"
)

// PubConfig configures a Pub.
type PubConfig struct {
	// HWM bounds the messages queued for one subscriber; <= 0 means
	// unbounded.
	HWM int
	// NoDrop makes Send wait for room in a full subscriber queue instead of
	// dropping the message for that subscriber (libzmq's ZMQ_XPUB_NODROP).
	NoDrop bool
	// HandshakeTimeout bounds the ZMTP handshake of a new peer.
	HandshakeTimeout time.Duration
	// MaxTopic bounds the topic of one subscription (default
	// DefaultMaxTopic). A peer that sends a longer one, or any data
	// message that is not a subscribe or cancel, is disconnected.
	MaxTopic int
	// MaxSubscriptions bounds the live subscriptions of one peer (default
	// DefaultMaxSubscriptions); one more disconnects it.
	MaxSubscriptions int
	// Listener configures Serve's netx loop (connection caps; Name
	// defaults to "zmq pub", Logger to Logger).
	Listener netx.Config
	// Logger receives why a peer was disconnected (default: discard; an
	// internal package: event.Publisher always passes its own).
	Logger *slog.Logger
}

// Defaults of PubConfig.
const (
	DefaultMaxTopic         = 256
	DefaultMaxSubscriptions = 1024
)

// Pub is the sending side of a PUB socket: it accepts subscribers on a
// listener, or keeps one connection to a bound SUB alive, and fans each
// message out to the peers whose subscriptions match its topic.
type Pub struct {
	cfg    PubConfig
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	loop   *netx.Loop

	mu      sync.Mutex
	peers   []*peer
	changed chan struct{} // closed and replaced when subscriptions change

	dropped atomic.Uint64
}

type peer struct {
	c    *Conn
	done chan struct{}
	once sync.Once

	mu      sync.Mutex
	subs    []string
	q       [][]byte
	spare   [][]byte
	writing bool
	wake    chan struct{}
	space   chan struct{} // closed and replaced when the writer drains q
	waiters int
	idle    chan struct{} // closed when q is empty and nothing is being written
}

// NewPub returns a Pub with no transport yet; call Serve or Connect.
func NewPub(cfg PubConfig) *Pub {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 5 * time.Second
	}
	if cfg.MaxTopic <= 0 {
		cfg.MaxTopic = DefaultMaxTopic
	}
	if cfg.MaxSubscriptions <= 0 {
		cfg.MaxSubscriptions = DefaultMaxSubscriptions
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Pub{cfg: cfg, ctx: ctx, cancel: cancel, changed: make(chan struct{})}
}

// Serve accepts subscribers on ln (through netx, with its caps) until
// Close. A peer counts as idle for netx's eviction until it subscribes.
func (p *Pub) Serve(ln net.Listener) {
	cfg := p.cfg.Listener
	cfg.Name = cmp.Or(cfg.Name, "zmq pub")
	if cfg.Logger == nil {
		cfg.Logger = p.cfg.Logger
	}
	p.loop = netx.Serve(ln, cfg, func(c *netx.Conn) { p.serveConn(c, true) })
}

// Connect keeps a connection to the bound SUB at e, reconnecting with
// backoff, until Close. Messages sent while it is down are not queued: a
// PUB only sends to subscriptions it knows.
func (p *Pub) Connect(e Endpoint) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for attempt := 0; p.ctx.Err() == nil; attempt++ {
			c, err := Dial(p.ctx, e)
			if err == nil {
				attempt = 0
				p.serveConn(c, false)
			}
			select {
			case <-p.ctx.Done():
			case <-time.After(backoff(attempt)):
			}
		}
	}()
}

// closeOnDone closes c when ctx ends, so blocked reads return.
func closeOnDone(ctx context.Context, c net.Conn, done <-chan struct{}) {
	select {
	case <-ctx.Done():
		_ = c.Close()
	case <-done:
	}
}

func (p *Pub) serveConn(raw net.Conn, server bool) {
	stop := make(chan struct{})
	defer close(stop)
	go closeOnDone(p.ctx, raw, stop)
	c, err := Handshake(raw, zmq4.Pub, server, p.cfg.HandshakeTimeout)
	if err != nil {
		_ = raw.Close()
		return
	}
	pe := &peer{c: c, done: make(chan struct{}), wake: make(chan struct{}, 1), space: make(chan struct{})}
	p.mu.Lock()
	p.peers = append(append([]*peer(nil), p.peers...), pe) // copy: Send reads the old slice unlocked
	p.mu.Unlock()

	var writer sync.WaitGroup
	writer.Add(1)
	go func() {
		defer writer.Done()
		pe.writeLoop()
	}()
	if err := p.readSubscriptions(c, pe); err != nil && p.ctx.Err() == nil {
		p.cfg.Logger.Warn("zmq subscriber disconnected", "peer", c.RemoteAddr(), "err", err)
	}
	pe.kill()
	writer.Wait()
	p.mu.Lock()
	peers := make([]*peer, 0, len(p.peers))
	for _, o := range p.peers {
		if o != pe {
			peers = append(peers, o)
		}
	}
	p.peers = peers
	p.mu.Unlock()
	p.notify()
}

// readSubscriptions reads the peer's subscriptions until it fails or
// sends anything else. A ZMTP 3.0 subscription is a one-frame message: 1
// (subscribe) or 0 (cancel), then the topic prefix.
func (p *Pub) readSubscriptions(c *Conn, pe *peer) error {
	c.SetLimits(Limits{MaxMessage: 1 + p.cfg.MaxTopic, MaxFrames: 1})
	for {
		msg, err := c.ReadMsg()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if len(msg) != 1 || len(msg[0]) == 0 || msg[0][0] > 1 {
			return fmt.Errorf("%w: a PUB accepts only subscribe and cancel messages", ErrProtocol)
		}
		n, ok := pe.subscribe(string(msg[0][1:]), msg[0][0] == 1, p.cfg.MaxSubscriptions)
		if !ok {
			return fmt.Errorf("%w: more than %d subscriptions", ErrLimit, p.cfg.MaxSubscriptions)
		}
		// A subscribed peer is doing work: netx evicts the others first.
		if n > 0 {
			c.Busy()
		} else {
			c.Idle()
		}
		p.notify()
	}
}

func (p *Pub) notify() {
	p.mu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// subscribe adds or cancels one subscription and returns how many are
// left; false when adding would pass limit.
func (pe *peer) subscribe(topic string, on bool, limit int) (int, bool) {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if on {
		if len(pe.subs) >= limit {
			return len(pe.subs), false
		}
		pe.subs = append(pe.subs, topic)
		return len(pe.subs), true
	}
	for i, s := range pe.subs {
		if s == topic {
			pe.subs = append(pe.subs[:i], pe.subs[i+1:]...)
			break
		}
	}
	return len(pe.subs), true
}

func (pe *peer) matches(topic string) bool {
	for _, s := range pe.subs {
		if strings.HasPrefix(topic, s) {
			return true
		}
	}
	return false
}

func (pe *peer) kill() {
	pe.once.Do(func() {
		close(pe.done)
		_ = pe.c.Close()
	})
}

func (pe *peer) writeLoop() {
	var bufs net.Buffers
	for {
		select {
		case <-pe.done:
			pe.mu.Lock()
			pe.q = nil
			pe.finishIdle()
			pe.mu.Unlock()
			return
		case <-pe.wake:
		}
		pe.mu.Lock()
		batch := pe.q
		pe.q = pe.spare[:0]
		pe.spare = nil
		pe.writing = len(batch) > 0
		if pe.waiters > 0 {
			close(pe.space)
			pe.space = make(chan struct{})
			pe.waiters = 0
		}
		pe.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		bufs = append(bufs[:0], batch...)
		err := pe.c.WriteBuffers(bufs)
		clear(batch)
		pe.mu.Lock()
		pe.spare = batch[:0]
		pe.writing = false
		if len(pe.q) == 0 {
			pe.finishIdle()
		}
		pe.mu.Unlock()
		if err != nil {
			pe.kill()
		}
	}
}

func (pe *peer) finishIdle() {
	if pe.idle != nil {
		close(pe.idle)
		pe.idle = nil
	}
}

// Send queues wire (a whole message built with AppendMsg, not modified
// afterwards) for every peer subscribed to topic. At a full queue it drops
// the message for that peer, or with NoDrop waits for room (or for ctx,
// the peer's death, or Close).
func (p *Pub) Send(ctx context.Context, topic string, wire []byte) {
	p.mu.Lock()
	peers := p.peers
	p.mu.Unlock()
	for _, pe := range peers {
		p.enqueue(ctx, pe, topic, wire)
	}
}

func (p *Pub) enqueue(ctx context.Context, pe *peer, topic string, wire []byte) {
	pe.mu.Lock()
	if !pe.matches(topic) {
		pe.mu.Unlock()
		return
	}
	for p.cfg.HWM > 0 && len(pe.q) >= p.cfg.HWM {
		if !p.cfg.NoDrop {
			pe.mu.Unlock()
			p.dropped.Add(1)
			return
		}
		space := pe.space
		pe.waiters++
		pe.mu.Unlock()
		select {
		case <-space:
		case <-pe.done:
			return
		case <-ctx.Done():
			return
		case <-p.ctx.Done():
			return
		}
		pe.mu.Lock()
	}
	select {
	case <-pe.done:
		pe.mu.Unlock()
		return
	default:
	}
	pe.q = append(pe.q, wire)
	pe.mu.Unlock()
	select {
	case pe.wake <- struct{}{}:
	default:
	}
}

// Flush waits until every peer's queue is written out, or ctx ends.
func (p *Pub) Flush(ctx context.Context) error {
	p.mu.Lock()
	peers := p.peers
	p.mu.Unlock()
	for _, pe := range peers {
		pe.mu.Lock()
		if len(pe.q) == 0 && !pe.writing {
			pe.mu.Unlock()
			continue
		}
		if pe.idle == nil {
			pe.idle = make(chan struct{})
		}
		idle := pe.idle
		pe.mu.Unlock()
		select {
		case <-idle:
		case <-pe.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Subscribers returns the number of peers with at least one subscription.
func (p *Pub) Subscribers() int {
	p.mu.Lock()
	peers := p.peers
	p.mu.Unlock()
	n := 0
	for _, pe := range peers {
		pe.mu.Lock()
		if len(pe.subs) > 0 {
			n++
		}
		pe.mu.Unlock()
	}
	return n
}

// WaitSubscribers returns once at least n peers have subscribed.
func (p *Pub) WaitSubscribers(ctx context.Context, n int) error {
	for {
		p.mu.Lock()
		ch := p.changed
		p.mu.Unlock()
		if p.Subscribers() >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-p.ctx.Done():
			return net.ErrClosed
		}
	}
}

// Dropped counts messages dropped at a subscriber's high-water mark.
func (p *Pub) Dropped() uint64 { return p.dropped.Load() }

// Close stops accepting, closes every connection and waits for all
// goroutines. Call Flush first to deliver what is queued.
func (p *Pub) Close() error {
	p.cancel()
	p.mu.Lock()
	peers := p.peers
	p.mu.Unlock()
	for _, pe := range peers {
		pe.kill()
	}
	if p.loop != nil {
		_ = p.loop.Close()
	}
	p.wg.Wait()
	return nil
}
