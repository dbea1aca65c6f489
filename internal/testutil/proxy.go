package testutil

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to a target, and
// breaks them as networks do: Reset closes the connections open now (a
// peer's RST), Partition holds bytes in both directions and new
// connections (neither refused nor lost) until healed, when they flow
// on, as TCP's retransmissions deliver them after a partition ends.
type Proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	cond   *sync.Cond
	conns  map[net.Conn]struct{}
	cut    bool // partitioned
	closed bool

	moved  atomic.Int64
	trip   atomic.Int64 // when > 0: once moved passes it, onTrip runs once
	onTrip func()
	trips  atomic.Int32
}

// NewProxy starts a proxy to target, stopped at the end of the test.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(func() {
		p.Stop()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port; Port its port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }
func (p *Proxy) Port() int    { return p.ln.Addr().(*net.TCPAddr).Port }

// TripAfter runs f once, when the bytes moved (both directions, counted
// from the start) pass n. Call it before traffic flows.
func (p *Proxy) TripAfter(n int64, f func()) {
	p.onTrip = f
	p.trip.Store(n)
}

// Trips counts the TripAfter callbacks run.
func (p *Proxy) Trips() int { return int(p.trips.Load()) }

// Partition cuts (true) or heals (false) the network between the two
// sides.
func (p *Proxy) Partition(cut bool) {
	p.mu.Lock()
	p.cut = cut
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Reset closes the connections open now; new ones are still forwarded.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Stop closes the listener and every connection (the test's end waits
// for the proxy's goroutines); it may be called more than once, and from
// a TripAfter callback.
func (p *Proxy) Stop() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	p.mu.Unlock()
	p.ln.Close()
	p.Reset()
}

// pass blocks while partitioned; false once stopped.
func (p *Proxy) pass() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.cut && !p.closed {
		p.cond.Wait()
	}
	return !p.closed
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if !p.pass() { // a SYN does not cross a partition either
				c.Close()
				return
			}
			d, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				return
			}
			if !p.track(d) {
				c.Close()
				return
			}
			p.wg.Add(2)
			go p.pipe(c, d)
			go p.pipe(d, c)
		}()
	}
}

// pipe copies src to dst, holding what it read while partitioned, and
// closes both at the end.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
			total := p.moved.Add(int64(n))
			if t := p.trip.Load(); t > 0 && total >= t && p.trip.CompareAndSwap(t, 0) {
				p.trips.Add(1)
				p.onTrip()
			}
		}
		if err != nil {
			return
		}
	}
}
