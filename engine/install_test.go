package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// transfer writes n bytes from a to b's buffer and returns Wait's error
// (or Submit's).
func transfer(t *testing.T, a, b *node, seg engine.SegmentID, seed uint64, n int) error {
	t.Helper()
	testutil.Fill(a.buf[:n], seed)
	batch, err := a.e.AllocateBatch(1)
	require.NoError(t, err)
	defer func() {
		for a.e.FreeBatch(batch) != nil { // a transport may still hold it for a moment
			time.Sleep(time.Millisecond)
		}
	}()
	if err := a.e.Submit(batch, []engine.Request{{Op: engine.Write, Local: a.buf[:n], Target: seg, TargetAddr: b.addr(0)}}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.e.Wait(ctx, batch); err != nil {
		return err
	}
	if !bytes.Equal(a.buf[:n], b.buf[:n]) {
		return errors.New("target bytes differ")
	}
	return nil
}

func protocolsOf(t *testing.T, e *engine.Engine, seg engine.SegmentID) ([]string, int) {
	t.Helper()
	d, err := e.SegmentDesc(seg)
	require.NoError(t, err)
	require.NotNil(t, d.Crescent)
	return d.Crescent.Protocols, d.TCPDataPort
}

// Transports come and go on live engines: routing follows at once on
// the engine that changed, the descriptor says so, and a peer sees it on
// its next fetch.
func TestInstallUninstallTransport(t *testing.T) {
	ctx := context.Background()
	cfg := engine.Config{Protocols: []string{"tcp", "shm"}}
	a := newNode(t, 1<<20, cfg)
	b := newNode(t, 1<<20, cfg)
	seg, err := a.e.OpenSegment(ctx, b.e.Name())
	require.NoError(t, err)
	defer a.e.CloseSegment(seg)
	require.NoError(t, transfer(t, a, b, seg, 1, 64<<10))

	// Without tcp the same-host peer is still reached over shm.
	require.NoError(t, a.e.UninstallTransport(ctx, "tcp"))
	assert.Equal(t, []string{"shm"}, a.e.Transports())
	assert.Zero(t, a.e.LocalDesc().TCPDataPort, "descriptor still offers the data port")
	assert.Equal(t, []string{"shm"}, a.e.LocalDesc().Crescent.Protocols)
	require.NoError(t, transfer(t, a, b, seg, 2, 64<<10))

	// Without any: refused, naming what was uninstalled.
	require.NoError(t, a.e.UninstallTransport(ctx, "shm"))
	assert.Empty(t, a.e.Transports())
	err = transfer(t, a, b, seg, 3, 4096)
	require.ErrorIs(t, err, engine.ErrNoTransport)
	require.ErrorIs(t, err, engine.ErrTransportUninstalled)
	assert.Contains(t, err.Error(), "tcp, shm")
	assert.ErrorIs(t, a.e.UninstallTransport(ctx, "tcp"), engine.ErrTransportUninstalled)
	assert.ErrorIs(t, a.e.InstallTransport(ctx, "nvmeof"), engine.ErrInvalidConfig)

	// Installed again: a new data port, in the configured order.
	require.NoError(t, a.e.InstallTransport(ctx, "shm"))
	require.NoError(t, a.e.InstallTransport(ctx, "tcp"))
	require.NoError(t, a.e.InstallTransport(ctx, "tcp"), "installing a running transport is done")
	assert.Equal(t, []string{"tcp", "shm"}, a.e.Transports())
	assert.NotZero(t, a.e.LocalDesc().TCPDataPort)
	require.NoError(t, transfer(t, a, b, seg, 4, 64<<10))

	// The peer's side: b drops tcp and shm; a learns it on its next fetch.
	require.NoError(t, a.e.UninstallTransport(ctx, "shm")) // a reaches b over tcp only
	oldPort := b.e.LocalDesc().TCPDataPort
	require.NoError(t, b.e.UninstallTransport(ctx, "tcp"))
	require.NoError(t, a.e.RefreshSegment(ctx, seg))
	protos, port := protocolsOf(t, a.e, seg)
	assert.Equal(t, []string{"shm"}, protos)
	assert.Zero(t, port)
	err = transfer(t, a, b, seg, 5, 4096)
	require.ErrorIs(t, err, engine.ErrNoTransport)
	assert.Contains(t, err.Error(), "offers [shm]")
	assert.ErrorIs(t, err, engine.ErrTransportUninstalled, "the one b offers is the one a uninstalled")
	assert.Contains(t, err.Error(), "not installed: shm (running here: [tcp])")

	require.NoError(t, b.e.InstallTransport(ctx, "tcp"))
	require.NoError(t, a.e.RefreshSegment(ctx, seg))
	protos, port = protocolsOf(t, a.e, seg)
	assert.Equal(t, []string{"tcp", "shm"}, protos)
	assert.NotZero(t, port)
	t.Logf("b's data port %d -> %d", oldPort, port)
	require.NoError(t, transfer(t, a, b, seg, 6, 256<<10))
}

// holdingTransport keeps the tasks handed to it while hold is set, so a
// request is surely in flight when the transport is uninstalled; Close
// closes the real transport and then hands it the held tasks, which it
// fails as any task it held at Close.
type holdingTransport struct {
	transport.Transport
	hold *atomic.Bool
	mu   sync.Mutex
	held []heldTasks
	in   chan struct{}
}

type heldTasks struct {
	p     transport.Peer
	tasks []*transport.Task
}

func (h *holdingTransport) Submit(p transport.Peer, tasks []*transport.Task) {
	if h.hold.Load() {
		h.mu.Lock()
		h.held = append(h.held, heldTasks{p, append([]*transport.Task(nil), tasks...)})
		h.mu.Unlock()
		h.in <- struct{}{}
		return
	}
	h.Transport.Submit(p, tasks)
}

func (h *holdingTransport) Close() error {
	err := h.Transport.Close()
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	for _, x := range held {
		h.Transport.Submit(x.p, x.tasks)
	}
	return err
}

// A request in flight on a transport being uninstalled fails with an
// error naming the transport; the next one, on the transport installed
// again, succeeds.
func TestUninstallFailsInFlightRequests(t *testing.T) {
	ctx := context.Background()
	var hold atomic.Bool
	in := make(chan struct{}, 4)
	restore := engine.SetTransportWrapper(func(tr transport.Transport) transport.Transport {
		if tr.Name() == "tcp" {
			return &holdingTransport{Transport: tr, hold: &hold, in: in}
		}
		return tr
	})
	defer restore()
	a := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	seg, err := a.e.OpenSegment(ctx, b.e.Name())
	require.NoError(t, err)
	defer a.e.CloseSegment(seg)

	hold.Store(true)
	batch, err := a.e.AllocateBatch(1)
	require.NoError(t, err)
	require.NoError(t, a.e.Submit(batch, []engine.Request{{Op: engine.Write, Local: a.buf[:4096], Target: seg, TargetAddr: b.addr(0)}}))
	<-in
	require.NoError(t, a.e.UninstallTransport(ctx, "tcp"))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := a.e.Wait(wctx, batch)
	require.ErrorIs(t, err, engine.ErrTransportUninstalled)
	assert.Contains(t, err.Error(), "tcp was uninstalled while the request ran")
	assert.Equal(t, engine.Failed, st.Status)
	require.NoError(t, a.e.FreeBatch(batch))

	hold.Store(false)
	require.NoError(t, a.e.InstallTransport(ctx, "tcp"))
	require.NoError(t, transfer(t, a, b, seg, 7, 64<<10))
}

// A transport installed at run time registers the buffers registered
// before it (rdma: memory regions on each device); uninstalling it
// withdraws them.
func TestInstallRegistersExistingBuffers(t *testing.T) {
	ctx := context.Background()
	f := soft.NewFabric()
	cfg := engine.Config{Protocols: []string{"tcp"}}
	var devs []*soft.Device
	for i := 0; i < 2; i++ {
		d := f.NewDevice(fmt.Sprintf("install_mlx5_%d", i), soft.Options{})
		t.Cleanup(func() { d.Close() })
		devs = append(devs, d)
		cfg.RDMA.Devices = append(cfg.RDMA.Devices, d)
	}
	mrs := func() (n int) {
		for _, d := range devs {
			n += d.Live().MRs
		}
		return n
	}
	a := newNode(t, 1<<20, cfg)
	require.Zero(t, mrs())
	require.NoError(t, a.e.InstallTransport(ctx, "rdma"))
	assert.Equal(t, []string{"tcp", "rdma"}, a.e.Transports())
	withOne := mrs()
	require.Positive(t, withOne, "the buffer registered before the install has no MRs")
	assert.Contains(t, a.e.LocalDesc().Crescent.Protocols, "rdma")

	// Buffers registered afterwards reach it too.
	p, err := mempool.New(mempool.Options{Size: 1 << 20, SlabSize: 1 << 20})
	require.NoError(t, err)
	defer p.Close()
	extra, err := p.Alloc(1 << 20)
	require.NoError(t, err)
	require.NoError(t, a.e.RegisterMemory(extra, "cpu:0"))
	require.Greater(t, mrs(), withOne)

	require.NoError(t, a.e.UninstallTransport(ctx, "rdma"))
	assert.Zero(t, mrs(), "MRs left behind by the uninstalled transport")
	assert.NotContains(t, a.e.LocalDesc().Crescent.Protocols, "rdma")
	require.NoError(t, a.e.UnregisterMemory(ctx, extra))
}

// Transfers, registrations and installs at once: every transfer either
// completes or fails with a clear error, and the engine ends usable.
func TestInstallUninstallConcurrent(t *testing.T) {
	ctx := context.Background()
	a := newNode(t, 4<<20, engine.Config{Protocols: []string{"tcp"}})
	b := newNode(t, 4<<20, engine.Config{Protocols: []string{"tcp"}})
	seg, err := a.e.OpenSegment(ctx, b.e.Name())
	require.NoError(t, err)
	defer a.e.CloseSegment(seg)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var completed, refused atomic.Int64
	errs := make(chan error, 64)
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch, err := a.e.AllocateBatch(1)
			if err != nil {
				errs <- err
				return
			}
			off := w << 20
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := a.e.Submit(batch, []engine.Request{{Op: engine.Write, Local: a.buf[off : off+256<<10], Target: seg, TargetAddr: b.addr(off)}})
				if err == nil {
					wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					_, err = a.e.Wait(wctx, batch)
					cancel()
				}
				switch {
				case err == nil:
					completed.Add(1)
				case errors.Is(err, engine.ErrTransportUninstalled):
					refused.Add(1)
				default:
					errs <- err
					return
				}
				for a.e.FreeBatch(batch) != nil {
					time.Sleep(time.Millisecond)
				}
				if batch, err = a.e.AllocateBatch(1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // registrations racing the installs
		defer wg.Done()
		p, err := mempool.New(mempool.Options{Size: 1 << 20, SlabSize: 1 << 20})
		if err != nil {
			errs <- err
			return
		}
		defer p.Close()
		mem, _ := p.Alloc(1 << 20)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := a.e.RegisterMemory(mem, "cpu:0"); err != nil {
				errs <- err
				return
			}
			if err := a.e.UnregisterMemory(ctx, mem); err != nil {
				errs <- err
				return
			}
		}
	}()
	for i := 0; i < 15; i++ {
		require.NoError(t, a.e.UninstallTransport(ctx, "tcp"))
		time.Sleep(2 * time.Millisecond)
		require.NoError(t, a.e.InstallTransport(ctx, "tcp"))
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("unexpected error: %v", err)
	}
	t.Logf("%d completed, %d failed naming the uninstalled transport", completed.Load(), refused.Load())
	require.NoError(t, transfer(t, a, b, seg, 8, 64<<10))
}

// Close ends an UnregisterMemory waiting for a transfer that only
// closing the transports can end (the wait holds the lock installs take;
// Close must not).
func TestCloseEndsUnregisterWaitingForTransfers(t *testing.T) {
	ctx := context.Background()
	var hold atomic.Bool
	in := make(chan struct{}, 4)
	restore := engine.SetTransportWrapper(func(tr transport.Transport) transport.Transport {
		return &holdingTransport{Transport: tr, hold: &hold, in: in}
	})
	defer restore()
	a := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}, TransferTimeout: 10 * time.Minute})
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	seg, err := a.e.OpenSegment(ctx, b.e.Name())
	require.NoError(t, err)
	hold.Store(true)
	batch, err := a.e.AllocateBatch(1)
	require.NoError(t, err)
	require.NoError(t, a.e.Submit(batch, []engine.Request{{Op: engine.Write, Local: a.buf[:4096], Target: seg, TargetAddr: b.addr(0)}}))
	<-in
	unregistered := make(chan error, 1)
	go func() { unregistered <- a.e.UnregisterMemory(ctx, a.buf) }()
	time.Sleep(50 * time.Millisecond) // let it reach the wait (either order must work)
	closed := make(chan error, 1)
	go func() { closed <- a.e.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close blocked behind an UnregisterMemory waiting for a transfer")
	}
	<-unregistered
}
