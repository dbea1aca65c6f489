package metadata

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"
)

// P2PHandshake is the connection string for peer-to-peer descriptor
// exchange: no store; a segment's name is its handshake "host:port".
const P2PHandshake = "P2PHANDSHAKE"

// Backend is where segment descriptors are published and found.
type Backend interface {
	// Publish makes the local descriptor visible (a no-op for P2P, where
	// peers ask the handshake server).
	Publish(ctx context.Context, d *SegmentDesc) error
	// Get returns the descriptor of segment name.
	Get(ctx context.Context, name string) (*SegmentDesc, error)
	// Remove withdraws segment name.
	Remove(ctx context.Context, name string) error
	// RPCAddr returns the handshake address of segment name.
	RPCAddr(ctx context.Context, name string) (string, error)
	Close() error
}

// Options configure a backend.
type Options struct {
	// Timeout bounds each backend operation (default 5s).
	Timeout time.Duration
	// Self returns the local descriptor; P2P requests carry it.
	Self func() *SegmentDesc
}

// Open returns the backend for a connection string. Only P2PHANDSHAKE is
// built in here; other schemes are added by the packages that implement
// them through Register.
func Open(conn string, opts Options) (Backend, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if conn == "" || strings.EqualFold(conn, P2PHandshake) {
		return &p2p{opts: opts}, nil
	}
	scheme := conn
	if i := strings.Index(conn, "://"); i >= 0 {
		scheme = conn[:i]
	}
	if f, ok := backends[scheme]; ok {
		return f(conn, opts)
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownServer, conn)
}

var backends = map[string]func(conn string, opts Options) (Backend, error){}

// Register adds a backend for connection strings "scheme://...". It is
// meant to be called from init functions.
func Register(scheme string, open func(conn string, opts Options) (Backend, error)) {
	backends[scheme] = open
}

type p2p struct{ opts Options }

func (p *p2p) Publish(context.Context, *SegmentDesc) error { return nil }
func (p *p2p) Remove(context.Context, string) error        { return nil }
func (p *p2p) Close() error                                { return nil }

func (p *p2p) RPCAddr(_ context.Context, name string) (string, error) {
	if _, _, err := net.SplitHostPort(name); err != nil {
		return "", fmt.Errorf("%w: P2P segment name %q is not host:port", ErrNotFound, name)
	}
	return name, nil
}

func (p *p2p) Get(ctx context.Context, name string) (*SegmentDesc, error) {
	addr, err := p.RPCAddr(ctx, name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	var self *SegmentDesc
	if p.opts.Self != nil {
		self = p.opts.Self()
	}
	return FetchDesc(ctx, addr, self)
}
