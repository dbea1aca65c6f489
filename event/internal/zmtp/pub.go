package zmtp

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
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
}

// Pub is the sending side of a PUB socket: it accepts subscribers on a
// listener, or keeps one connection to a bound SUB alive, and fans each
// message out to the peers whose subscriptions match its topic.
type Pub struct {
	cfg    PubConfig
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ln     net.Listener

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
	ctx, cancel := context.WithCancel(context.Background())
	return &Pub{cfg: cfg, ctx: ctx, cancel: cancel, changed: make(chan struct{})}
}

// Serve accepts subscribers on ln until Close.
func (p *Pub) Serve(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		acceptLoop(p.ctx, ln, &p.wg, func(c net.Conn) { p.serveConn(c, true) })
	}()
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

// acceptLoop runs serve for each accepted connection in its own goroutine
// tracked by wg, until ctx ends or ln closes.
func acceptLoop(ctx context.Context, ln net.Listener, wg *sync.WaitGroup, serve func(net.Conn)) {
	for attempt := 0; ; {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of fds and the like: back off, keep serving.
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff(attempt)):
			}
			attempt++
			continue
		}
		attempt = 0
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve(c)
		}()
	}
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
	for {
		msg, err := c.ReadMsg()
		if err != nil {
			break
		}
		// ZMTP 3.0 subscriptions: a one-frame message, 1 or 0 then the
		// topic prefix.
		if len(msg) == 1 && len(msg[0]) > 0 && msg[0][0] <= 1 {
			pe.subscribe(string(msg[0][1:]), msg[0][0] == 1)
			p.notify()
		}
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

func (p *Pub) notify() {
	p.mu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

func (pe *peer) subscribe(topic string, on bool) {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if on {
		pe.subs = append(pe.subs, topic)
		return
	}
	for i, s := range pe.subs {
		if s == topic {
			pe.subs = append(pe.subs[:i], pe.subs[i+1:]...)
			return
		}
	}
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
	if p.ln != nil {
		_ = p.ln.Close()
	}
	p.mu.Lock()
	peers := p.peers
	p.mu.Unlock()
	for _, pe := range peers {
		pe.kill()
	}
	p.wg.Wait()
	return nil
}
