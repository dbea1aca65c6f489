package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/grpctune"
	"github.com/crescent-kv/crescent/store/rpcerr"
)

// MasterConn is a connection to a master, gRPC or crpc, for
// storepb.NewMasterClient.
type MasterConn interface {
	grpc.ClientConnInterface
	io.Closer
}

// DialMaster connects to the master at addr as clients do: proto is
// "crpc", "grpc", "grpc_tuned" (gRPC with TunedGRPCDialOptions; the
// master must serve with grpctune.ServerOptions), or "auto" (or empty):
// crpc when the master answers it, else gRPC. It returns the connection and the protocol used; intercept,
// when not nil, sees every call. With "auto" and a master that does not
// answer yet, the protocol is "auto": each call tries crpc again until
// the master answers, and the connection's Protocol method says which
// one it then settled on.
func DialMaster(ctx context.Context, addr, proto string, intercept grpc.UnaryClientInterceptor) (MasterConn, string, error) {
	return DialMasterSecure(ctx, addr, proto, intercept, Security{})
}

// DialMasterSecure is DialMaster with sec's cluster token and TLS on
// every connection, crpc and gRPC alike.
func DialMasterSecure(ctx context.Context, addr, proto string, intercept grpc.UnaryClientInterceptor, sec Security) (MasterConn, string, error) {
	return dialMaster(ctx, addr, proto, intercept, sec, 0)
}

// dialMaster is DialMasterSecure; a crpc connection made at once bounds
// each call by callTimeout (crpc.WithCallTimeout; 0: only the context).
func dialMaster(ctx context.Context, addr, proto string, intercept grpc.UnaryClientInterceptor, sec Security, callTimeout time.Duration) (MasterConn, string, error) {
	switch proto {
	case "", "auto", "crpc", "grpc", "grpc_tuned":
	default:
		return nil, "", fmt.Errorf("%w: master protocol %q (want auto, crpc, grpc or grpc_tuned)", ErrInvalidConfig, proto)
	}
	if proto == "grpc" || proto == "grpc_tuned" {
		var extra []grpc.DialOption
		if proto == "grpc_tuned" {
			extra = TunedGRPCDialOptions()
		}
		conn, err := dialGRPC(addr, intercept, sec, extra...)
		if err != nil {
			return nil, "", err
		}
		return conn, proto, nil
	}
	opts := crpcDialOptions(sec, callTimeout)
	if intercept != nil {
		opts = append(opts, crpc.WithUnaryInterceptor(intercept))
	}
	cc, err := crpc.Dial(ctx, addr, opts...)
	switch {
	case err == nil:
		return cc, "crpc", nil
	case proto == "crpc":
		return nil, "", fmt.Errorf("store: master %s: %w", addr, rpcerr.FromStatus(err))
	case errors.Is(err, crpc.ErrNotCRPC):
		conn, err := dialGRPC(addr, intercept, sec)
		if err != nil {
			return nil, "", err
		}
		return conn, "grpc", nil
	case refusedForGood(err):
		return nil, "", fmt.Errorf("store: master %s: %w", addr, err)
	}
	// Not reachable yet: decide when it is, not for the client's life.
	g, err := dialGRPC(addr, nil, sec) // refuses a malformed address now
	if err != nil {
		return nil, "", err
	}
	g.Close()
	return &autoConn{addr: addr, intercept: intercept, sec: sec, sem: make(chan struct{}, 1), callTimeout: callTimeout}, "auto", nil
}

// crpcDialOptions are a master connection's crpc options: sec's, and
// each call bounded by callTimeout (0: by its context only).
func crpcDialOptions(sec Security, callTimeout time.Duration) []crpc.Option {
	opts := sec.crpcOptions()
	if callTimeout > 0 {
		opts = append(opts, crpc.WithCallTimeout(callTimeout))
	}
	return opts
}

// callBounder is a master connection that bounds each call itself
// (crpc.Conn with WithCallTimeout, autoConn, haConn): CallTimeout is the
// bound, 0 for none.
type callBounder interface{ CallTimeout() time.Duration }

// TunedGRPCDialOptions are the client options of "grpc_tuned" (added to
// the plain gRPC ones: insecure transport, 256 MiB messages); the master
// must serve with grpctune.ServerOptions (crescent-master --grpc_tuned),
// whose keepalive policy permits these pings.
func TunedGRPCDialOptions() []grpc.DialOption { return grpctune.DialOptions() }

func dialGRPC(addr string, intercept grpc.UnaryClientInterceptor, sec Security, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(sec.grpcCredentials()),
		// Batch answers for many keys exceed gRPC's 4 MiB default.
		// The replay buffer as large as a call may be, so grpc-go's
		// transparent retry of a refused call covers every call.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20), grpc.MaxCallSendMsgSize(256<<20),
			grpc.MaxRetryRPCBufferSize(256<<20)),
	}, extra...)
	if intercept != nil {
		opts = append(opts, grpc.WithUnaryInterceptor(intercept))
	}
	// After intercept, so it sees one call however often it is sent.
	opts = append(opts, grpc.WithChainUnaryInterceptor(retryRefused))
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: master address %q: %w", ErrInvalidConfig, addr, err)
	}
	return conn, nil
}

// autoConn is "auto" against a master not reachable at dial time: each
// call dials crpc first; a master that answers crpc settles it on crpc
// (whose Conn redials by itself), one that answers otherwise on gRPC.
type autoConn struct {
	addr      string
	intercept grpc.UnaryClientInterceptor
	sec       Security
	crpcOnly  bool          // MasterProtocol "crpc": never settle on gRPC
	sem       chan struct{} // one dial at a time; waiters keep their deadline
	// callTimeout > 0 bounds every call (CallTimeout): crpc by
	// crpc.WithCallTimeout, gRPC by a context per call.
	callTimeout time.Duration

	mu     sync.Mutex
	conn   MasterConn // nil until settled
	proto  string
	closed bool
}

// Protocol is "crpc" or "grpc" once settled, else "auto".
func (a *autoConn) Protocol() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn == nil {
		return "auto"
	}
	return a.proto
}

// CallTimeout is the bound the connection puts on each call (0: none).
func (a *autoConn) CallTimeout() time.Duration { return a.callTimeout }

func (a *autoConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	invoke := func(ctx context.Context, method string, args, reply any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
		c, err := a.settled()
		if err != nil {
			return err
		}
		if _, bounded := c.(*crpc.Conn); a.callTimeout > 0 && !bounded {
			// gRPC, or not settled yet (the dial this call makes
			// included): a context bounds the call.
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, a.callTimeout)
			defer cancel()
		}
		if c == nil {
			if c, err = a.get(ctx); err != nil {
				return err
			}
		}
		return c.Invoke(ctx, method, args, reply, opts...)
	}
	if a.intercept != nil {
		return a.intercept(ctx, method, args, reply, nil, invoke, opts...)
	}
	return invoke(ctx, method, args, reply, nil, opts...)
}

func (a *autoConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	c, err := a.get(ctx)
	if err != nil {
		return nil, err
	}
	return c.NewStream(ctx, desc, method, opts...)
}

// get returns the settled connection, or tries to settle it.
func (a *autoConn) get(ctx context.Context) (MasterConn, error) {
	if c, err := a.settled(); c != nil || err != nil {
		return c, err
	}
	select {
	case a.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	defer func() { <-a.sem }()
	if c, err := a.settled(); c != nil || err != nil {
		return c, err
	}
	var conn MasterConn
	proto := "crpc"
	cc, err := crpc.Dial(ctx, a.addr, crpcDialOptions(a.sec, a.callTimeout)...)
	switch {
	case err == nil:
		conn = cc
	case errors.Is(err, crpc.ErrNotCRPC) && !a.crpcOnly:
		if conn, err = dialGRPC(a.addr, nil, a.sec); err != nil {
			return nil, err
		}
		proto = "grpc"
	case errors.Is(err, crpc.ErrNotCRPC) || refusedForGood(err):
		return nil, fmt.Errorf("store: master %s: %w", a.addr, rpcerr.FromStatus(err))
	default:
		return nil, crpc.Unsent(err) // still unreachable: the next call tries again
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		conn.Close()
		return nil, status.Error(codes.Canceled, "store: master connection closed")
	}
	a.conn, a.proto = conn, proto
	return conn, nil
}

func (a *autoConn) settled() (MasterConn, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, status.Error(codes.Canceled, "store: master connection closed")
	}
	return a.conn, nil
}

func (a *autoConn) Close() error {
	a.mu.Lock()
	a.closed = true
	c := a.conn
	a.mu.Unlock()
	if c != nil {
		return c.Close()
	}
	return nil
}

// dialLazy connects to addr without waiting for it to answer, for an HA
// client's new leader (which may still be warming up): gRPC connects in
// the background; crpc and "auto" dial at the first call, and again at
// each call until the master answers.
// A crpc or "auto" connection bounds each call by callTimeout (0: none).
func dialLazy(addr, proto string, intercept grpc.UnaryClientInterceptor, sec Security, callTimeout time.Duration) (MasterConn, string, error) {
	switch proto {
	case "grpc", "grpc_tuned":
		return DialMasterSecure(context.Background(), addr, proto, intercept, sec)
	case "", "auto", "crpc":
		g, err := dialGRPC(addr, nil, sec) // refuses a malformed address now
		if err != nil {
			return nil, "", err
		}
		g.Close()
		return &autoConn{addr: addr, intercept: intercept, sec: sec, sem: make(chan struct{}, 1), crpcOnly: proto == "crpc", callTimeout: callTimeout}, cmp.Or(proto, "auto"), nil
	}
	return DialMasterSecure(context.Background(), addr, proto, intercept, sec) // the error
}

// maxRefusedRetries bounds how often a gRPC call the master refused
// unprocessed (rpcerr.Unprocessed) is sent again; the waits between grow
// from 1-2 ms to 128-256 ms, at most about half a second in all.
const maxRefusedRetries = 8

// retryRefused is the innermost interceptor of a gRPC master connection:
// it sends a call the master refused before processing it
// (rpcerr.Unprocessed: its request-byte bound or its bound on calls
// open) again, after a growing wait, whatever its method (nothing was
// applied). grpc-go retries a REFUSED_STREAM once by itself, and only a
// call under its 256 KiB replay buffer; a larger call or a second
// refusal would reach the caller as UNAVAILABLE, and a call past the
// calls bound as RESOURCE_EXHAUSTED.
func retryRefused(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	wait := time.Millisecond
	for attempt := 0; ; attempt++ {
		err := invoke(ctx, method, req, reply, cc, opts...)
		if err == nil || attempt == maxRefusedRetries || !rpcerr.Unprocessed(err) {
			return err
		}
		t := time.NewTimer(wait + time.Duration(rand.Int64N(int64(wait))))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		wait *= 2
	}
}
