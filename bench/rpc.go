package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/internal/drpcx"
	"github.com/crescent-kv/crescent/internal/grpctune"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
	"github.com/crescent-kv/crescent/store/storepb"
)

// RPC layers the master can be reached by (--master_protocol, and
// crescent-bench rpc --layers).
const (
	LayerGRPC      = "grpc"
	LayerGRPCTuned = "grpc_tuned"
	LayerCRPC      = "crpc"
	LayerDRPC      = "drpc"
)

// RPCLayers are the layers crescent-bench rpc measures by default, the
// baseline (plain gRPC) first.
var RPCLayers = []string{LayerGRPC, LayerGRPCTuned, LayerCRPC, LayerDRPC}

// ErrRPCConfig reports an RPCConfig that cannot run.
var ErrRPCConfig = errors.New("bench: invalid rpc config")

// dialMaster is store.DialMaster plus drpc, which only the bench speaks.
func dialMaster(ctx context.Context, addr, proto string, intercept grpc.UnaryClientInterceptor) (store.MasterConn, string, error) {
	if proto == LayerDRPC {
		c, err := drpcx.Dial(ctx, addr, intercept)
		return c, LayerDRPC, err
	}
	return store.DialMaster(ctx, addr, proto, intercept)
}

// masterDialer is the store.Config.MasterDialer for proto (nil: the
// store's own DialMaster).
func masterDialer(proto string) func(context.Context, string, grpc.UnaryClientInterceptor) (store.MasterConn, error) {
	if proto != LayerDRPC {
		return nil
	}
	return func(ctx context.Context, addr string, ic grpc.UnaryClientInterceptor) (store.MasterConn, error) {
		c, _, err := dialMaster(ctx, addr, LayerDRPC, ic)
		return c, err
	}
}

// grpcServerOptions are the in-process master's gRPC options for the
// clients' protocol: tuned ones for grpc_tuned, as crescent-master
// --grpc_tuned uses.
func grpcServerOptions(proto string) []grpc.ServerOption {
	if proto == LayerGRPCTuned {
		return grpctune.ServerOptions()
	}
	return nil
}

// serveDRPC serves svc over drpc on a new loopback port until ctx ends;
// done receives Serve's result.
func serveDRPC(ctx context.Context, svc *service.Service) (addr string, done <-chan error, err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	s := drpcx.NewServer(svc.UnaryInterceptor(), netx.Config{})
	if err := s.Register(&storepb.Master_ServiceDesc, svc); err != nil {
		lis.Close()
		return "", nil, err
	}
	ch := make(chan error, 1)
	go func() { ch <- s.Serve(ctx, lis) }()
	return lis.Addr().String(), ch, nil
}

// RPCConfig configures RunRPC.
type RPCConfig struct {
	// Layers to measure (default RPCLayers); the first row of each
	// in-flight count is the baseline's when "grpc" is among them.
	Layers []string
	// Inflight are the calls kept in flight, one row each (default 1, 8).
	Inflight []int
	// Duration per cell (layer x in flight), split in Rounds (default 3 s).
	Duration time.Duration
	// Rounds: each cell is measured in this many slices, the layers
	// taking turns (default: one per 500 ms, at least 2).
	Rounds int
}

// RPCRow is one cell.
type RPCRow struct {
	Layer       string  `json:"layer"`
	Inflight    int     `json:"inflight"`
	Calls       int64   `json:"calls"`
	CallsPerSec float64 `json:"calls_per_sec"`
	P50Us       float64 `json:"p50_us"`
	P99Us       float64 `json:"p99_us"`
	// Ratio is CallsPerSec over plain gRPC's at the same in-flight count
	// (0 when grpc is not measured).
	Ratio float64 `json:"ratio"`
	// CPUUsPerCall is this process's CPU time (user + system: client and
	// master both) per call, less noisy than calls/s on a shared machine.
	CPUUsPerCall float64 `json:"cpu_us_per_call"`
	// Errors are calls that failed (none expected).
	Errors int64 `json:"errors"`
}

func (c *RPCConfig) setDefaults() error {
	if len(c.Layers) == 0 {
		c.Layers = slices.Clone(RPCLayers)
	}
	seen := map[string]bool{}
	for _, l := range c.Layers {
		if !slices.Contains(RPCLayers, l) {
			return fmt.Errorf("%w: layer %q (want grpc, grpc_tuned, crpc or drpc)", ErrRPCConfig, l)
		}
		if seen[l] {
			return fmt.Errorf("%w: layer %q twice", ErrRPCConfig, l)
		}
		seen[l] = true
	}
	if len(c.Inflight) == 0 {
		c.Inflight = []int{1, 8}
	}
	for _, n := range c.Inflight {
		if n < 1 || n > 1024 {
			return fmt.Errorf("%w: in flight %d (want 1..1024)", ErrRPCConfig, n)
		}
	}
	if c.Duration == 0 {
		c.Duration = 3 * time.Second
	}
	if c.Duration < 0 {
		return fmt.Errorf("%w: duration %v", ErrRPCConfig, c.Duration)
	}
	if c.Rounds == 0 {
		c.Rounds = max(2, int(c.Duration/(500*time.Millisecond)))
	}
	if c.Rounds < 0 {
		return fmt.Errorf("%w: rounds %d", ErrRPCConfig, c.Rounds)
	}
	return nil
}

// RunRPC measures unary calls (ExistKey of a missing key) to one
// in-process master over each layer: plain gRPC and crpc on the
// master's port, tuned gRPC on a second port served with
// grpctune.ServerOptions, drpc on a third. Layers take turns in
// each round, the order rotating, so drift weighs on all alike.
func RunRPC(ctx context.Context, c RPCConfig) (rows []RPCRow, err error) {
	if err := c.setDefaults(); err != nil {
		return nil, err
	}
	rig, err := newRPCRig(ctx, c.Layers)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, rig.close()) }()
	conns := rig.conns
	type cell struct {
		hist   Histogram
		calls  int64
		errs   int64
		lastEr error
		dur    time.Duration
		cpu    time.Duration
	}
	cells := map[string]map[int]*cell{}
	for _, l := range c.Layers {
		cells[l] = map[int]*cell{}
		for _, n := range c.Inflight {
			cells[l][n] = &cell{}
		}
	}
	slice := c.Duration / time.Duration(c.Rounds)
	for r := range c.Rounds {
		for _, n := range c.Inflight {
			for i := range c.Layers {
				l := c.Layers[(i+r)%len(c.Layers)]
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				cpu0 := processCPU()
				h, calls, errs, lastErr, d := measureRPC(ctx, storepb.NewMasterClient(conns[l]), n, slice)
				ce := cells[l][n]
				ce.cpu += processCPU() - cpu0
				ce.hist.Merge(&h)
				ce.calls += calls
				ce.errs += errs
				ce.dur += d
				if lastErr != nil {
					ce.lastEr = lastErr
				}
			}
		}
	}
	for _, n := range c.Inflight {
		var base float64
		for _, l := range c.Layers {
			ce := cells[l][n]
			if ce.calls == 0 {
				return nil, fmt.Errorf("bench: %s at %d in flight: no call answered: %v", l, n, ce.lastEr)
			}
			row := RPCRow{Layer: l, Inflight: n, Calls: ce.calls, CallsPerSec: float64(ce.calls) / ce.dur.Seconds(),
				P50Us: float64(ce.hist.Quantile(0.5)) / 1e3, P99Us: float64(ce.hist.Quantile(0.99)) / 1e3, Errors: ce.errs,
				CPUUsPerCall: float64(ce.cpu) / 1e3 / float64(ce.calls)}
			if l == LayerGRPC {
				base = row.CallsPerSec
			}
			rows = append(rows, row)
		}
		if base > 0 {
			for i := range rows {
				if rows[i].Inflight == n {
					rows[i].Ratio = rows[i].CallsPerSec / base
				}
			}
		}
	}
	return rows, nil
}

// processCPU is the process's user + system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rpcRig is one in-process master served over each layer, with a client
// connection per layer.
type rpcRig struct {
	m     *master.Master
	stop  context.CancelFunc
	done  []<-chan error
	conns map[string]store.MasterConn
}

// newRPCRig serves plain gRPC and crpc on the master's port, tuned gRPC
// on a second one (grpctune.ServerOptions), drpc on a third.
func newRPCRig(ctx context.Context, layers []string) (_ *rpcRig, err error) {
	m, err := master.New(master.Config{})
	if err != nil {
		return nil, err
	}
	if err := m.Start(); err != nil {
		m.Close()
		return nil, err
	}
	sctx, stop := context.WithCancel(context.Background())
	r := &rpcRig{m: m, stop: stop, conns: map[string]store.MasterConn{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.close())
		}
	}()
	serve := func(opts ...grpc.ServerOption) (string, error) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		ch := make(chan error, 1)
		svc := service.New(m)
		go func() { ch <- svc.Serve(sctx, lis, opts...) }()
		r.done = append(r.done, ch)
		return lis.Addr().String(), nil
	}
	addrs := map[string]string{}
	for _, l := range layers {
		switch l {
		case LayerGRPC, LayerCRPC:
			if addrs[LayerGRPC] == "" {
				a, err := serve()
				if err != nil {
					return nil, err
				}
				addrs[LayerGRPC], addrs[LayerCRPC] = a, a
			}
		case LayerGRPCTuned:
			a, err := serve(grpctune.ServerOptions()...)
			if err != nil {
				return nil, err
			}
			addrs[l] = a
		case LayerDRPC:
			a, ch, err := serveDRPC(sctx, service.New(m))
			if err != nil {
				return nil, err
			}
			addrs[l], r.done = a, append(r.done, ch)
		}
	}
	for _, l := range layers {
		cc, _, err := dialMaster(ctx, addrs[l], l, nil)
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", l, err)
		}
		r.conns[l] = cc
	}
	return r, nil
}

func (r *rpcRig) close() error {
	var err error
	for _, cc := range r.conns {
		cc.Close()
	}
	r.stop()
	for _, ch := range r.done {
		if e := <-ch; e != nil && !errors.Is(e, context.Canceled) {
			err = errors.Join(err, e)
		}
	}
	return errors.Join(err, r.m.Close())
}

// measureRPC keeps n ExistKey calls in flight for d.
func measureRPC(ctx context.Context, mc storepb.MasterClient, n int, d time.Duration) (Histogram, int64, int64, error, time.Duration) {
	req := &storepb.ExistKeyRequest{Key: "crescent-bench-rpc-missing", NoLease: true}
	var (
		mu      sync.Mutex
		all     Histogram
		calls   atomic.Int64
		errs    atomic.Int64
		lastErr error
		wg      sync.WaitGroup
	)
	// One untimed call per worker opens the connections.
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mc.ExistKey(ctx, req)
		}()
	}
	wg.Wait()
	start := time.Now()
	end := start.Add(d)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var h Histogram
			// At least one call each, however late the worker starts.
			for t, tries := time.Now(), 0; ; t, tries = time.Now(), tries+1 {
				if tries > 0 && !t.Before(end) {
					break
				}
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := mc.ExistKey(cctx, req)
				cancel()
				if err != nil {
					errs.Add(1)
					mu.Lock()
					lastErr = err
					mu.Unlock()
					if ctx.Err() != nil {
						break
					}
					continue
				}
				h.Record(time.Since(t))
				calls.Add(1)
			}
			mu.Lock()
			all.Merge(&h)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all, calls.Load(), errs.Load(), lastErr, time.Since(start)
}
