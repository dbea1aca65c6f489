package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/internal/netx"
)

// Target is a running bench target: an engine with a registered buffer
// and a raw TCP stream server for the initiator's baseline.
type Target struct {
	s        *side
	loop     *netx.Loop
	Segment  string // the segment name initiators open
	Baseline string // host:port of the baseline stream server
}

// ServeTarget starts target mode.
func ServeTarget(c TransferConfig) (*Target, error) {
	c.Mode = "target"
	if err := c.setDefaults(); err != nil {
		return nil, err
	}
	if c.Protocol == "cxl" && c.CXLDevice == "" {
		return nil, errors.New("bench: target mode with protocol cxl needs --cxl_device (the device the initiator maps too)")
	}
	s, err := newSide(&c)
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(s.e.Name())
	if err != nil {
		s.close()
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		s.close()
		return nil, err
	}
	t := &Target{s: s, Segment: s.e.Name(), Baseline: ln.Addr().String()}
	t.loop = netx.Serve(ln, netx.Config{Name: "bench baseline"}, func(conn *netx.Conn) { t.serveBaseline(conn, c.BlockSize) })
	return t, nil
}

// serveBaseline answers one baseline stream: a connection starting with
// 'W' is drained into the buffer, one starting with 'R' is fed from it.
func (t *Target) serveBaseline(c *netx.Conn, block int) {
	var cmd [1]byte
	if _, err := io.ReadFull(c, cmd[:]); err != nil {
		return
	}
	c.Busy()
	buf := t.s.buf
	for off := 0; ; off += block {
		if off+block > len(buf) {
			off = 0
		}
		var err error
		if cmd[0] == 'W' {
			_, err = io.ReadFull(c, buf[off:off+block])
		} else {
			_, err = c.Write(buf[off : off+block])
		}
		if err != nil {
			return
		}
	}
}

// Close stops the target.
func (t *Target) Close() {
	t.loop.Close()
	t.s.close()
}

// remoteStream measures raw TCP to a target's baseline server: `streams`
// connections moving block-sized chunks in the operation's direction.
func remoteStream(ctx context.Context, addr string, buf []byte, streams int, d time.Duration, op string) (float64, error) {
	cmd := byte('W')
	if op == "read" {
		cmd = 'R'
	}
	conns := make([]net.Conn, 0, streams)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < streams; i++ {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return 0, fmt.Errorf("baseline server %s: %w", addr, err)
		}
		c.(*net.TCPConn).SetNoDelay(true)
		if _, err := c.Write([]byte{cmd}); err != nil {
			return 0, err
		}
		conns = append(conns, c)
	}
	const block = 1 << 20
	var moved atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := buf[(len(buf)/streams)*i : (len(buf)/streams)*(i+1)]
			c.SetDeadline(deadline)
			for off := 0; ctx.Err() == nil; off += block {
				if off+block > len(part) {
					off = 0
				}
				var n int
				var err error
				if cmd == 'W' {
					n, err = c.Write(part[off : off+min(block, len(part))])
				} else {
					n, err = io.ReadFull(c, part[off:off+min(block, len(part))])
				}
				moved.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(moved.Load()) / time.Since(start).Seconds() / 1e9, nil
}
