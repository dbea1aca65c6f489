package engine_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/metadata/httpmeta"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
)

// blockingNotifyTarget is a handshake server whose Notify handler holds
// every notification until release is closed.
type blockingNotifyTarget struct {
	name    string
	entered chan struct{}
	release chan struct{}
}

func newBlockingNotifyTarget(t *testing.T) *blockingNotifyTarget {
	bt := &blockingNotifyTarget{entered: make(chan struct{}, 16), release: make(chan struct{})}
	var mu sync.Mutex
	var name string
	srv, err := metadata.NewServer(metadata.ServerConfig{Addr: "127.0.0.1:0", Handlers: metadata.Handlers{
		Metadata: func() *metadata.SegmentDesc {
			mu.Lock()
			defer mu.Unlock()
			return &metadata.SegmentDesc{Name: name, Protocol: "tcp", TCPDataPort: 1, TCPProtoVersion: 2,
				Buffers: []metadata.Buffer{{Name: "cpu:0", Addr: 0x10000000, Length: 1 << 20}}}
		},
		Notify: func(from, msg string) {
			bt.entered <- struct{}{}
			<-bt.release
		},
	}})
	require.NoError(t, err)
	mu.Lock()
	name = srv.Addr()
	mu.Unlock()
	bt.name = name
	t.Cleanup(func() {
		close(bt.release)
		srv.Close()
	})
	return bt
}

// TestNotifyErrorStaysInItsRound: a notification of round 1 that fails
// after round 2 of the same batch started must not be reported by round 2.
func TestNotifyErrorStaysInItsRound(t *testing.T) {
	a := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}, MetadataTimeout: time.Second})
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	bt := newBlockingNotifyTarget(t)
	ctx := context.Background()
	seg, err := a.e.OpenSegment(ctx, b.e.Name())
	require.NoError(t, err)
	notifySeg, err := a.e.OpenSegment(ctx, bt.name)
	require.NoError(t, err)

	id, err := a.e.AllocateBatch(2)
	require.NoError(t, err)
	round1 := []engine.Request{{Op: engine.Write, Local: a.buf[:4096], Target: seg, TargetAddr: b.addr(0)}}
	require.NoError(t, a.e.SubmitWithNotify(id, round1, notifySeg, "round 1"))
	done1, err := a.e.Done(id)
	require.NoError(t, err)
	<-bt.entered // round 1 completed; its notification hangs until the sender's timeout

	round2 := []engine.Request{{Op: engine.Write, Local: a.buf[4096:8192], Target: seg, TargetAddr: b.addr(4096)}}
	require.NoError(t, a.e.Submit(id, round2))
	st := wait(t, a.e, id)
	require.NoError(t, st.NotifyErr)

	<-done1 // round 1's notification has failed by now
	st, err = a.e.BatchStatus(id)
	require.NoError(t, err)
	require.NoError(t, st.NotifyErr, "round 1's notification error reported by round 2")
	require.NoError(t, a.e.FreeBatch(id))
}

func sendNotify(t *testing.T, to, from, msg string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return metadata.SendNotify(ctx, to, from, msg)
}

// TestNotificationBudget floods an engine that never drains: what it
// holds stays within the byte budget, the oldest go first, and oversized
// messages are dropped.
func TestNotificationBudget(t *testing.T) {
	const budget, max = 64 << 10, 8 << 10
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}, NotifyBudget: budget, NotifyMaxMessage: max})
	const n, size = 200, 4 << 10
	for i := 0; i < n; i++ {
		msg := fmt.Sprintf("%06d", i) + strings.Repeat("x", size-6)
		require.NoError(t, sendNotify(t, b.e.Name(), "flooder", msg))
		require.LessOrEqual(t, b.e.Stats().NotificationBytes, uint64(budget), "after %d", i)
	}
	// One too big for a notification (yet within the frame bound).
	require.NoError(t, sendNotify(t, b.e.Name(), "flooder", strings.Repeat("y", max+1)))
	st := b.e.Stats()
	got := b.e.Notifications()
	require.NotEmpty(t, got)
	require.Less(t, len(got), n)
	require.Equal(t, uint64(n+1-len(got)), st.NotificationsDropped)
	for i, x := range got { // the newest, in order
		require.Equal(t, fmt.Sprintf("%06d", n-len(got)+i), x.Msg[:6])
		require.Equal(t, "flooder", x.From)
	}
	require.Zero(t, b.e.Stats().NotificationBytes, "drained")
}

// TestNotificationRingOrder: beyond the count bound the oldest is
// dropped, one per new message, and the ring keeps working after wraps
// and drains.
func TestNotificationRingOrder(t *testing.T) {
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}, NotifyQueue: 5})
	for round := 0; round < 3; round++ {
		for i := 0; i < 12; i++ {
			require.NoError(t, sendNotify(t, b.e.Name(), "s", fmt.Sprint(round*100+i)))
		}
		var msgs []string
		for _, x := range b.e.Notifications() {
			msgs = append(msgs, x.Msg)
		}
		want := []string{}
		for i := 7; i < 12; i++ {
			want = append(want, fmt.Sprint(round*100+i))
		}
		require.Equal(t, want, msgs)
	}
	require.Equal(t, uint64(3*7), b.e.Stats().NotificationsDropped)
}

// TestNotificationsOff: an engine with notifications off refuses them and
// stores nothing.
func TestNotificationsOff(t *testing.T) {
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}, Notifications: engine.NotifyOff})
	for i := 0; i < 10; i++ {
		require.ErrorIs(t, sendNotify(t, b.e.Name(), "s", "hello"), metadata.ErrRejected)
	}
	require.Empty(t, b.e.Notifications())
	require.Zero(t, b.e.Stats().NotificationBytes)

	_, err := engine.New(engine.Config{LocalServerName: "127.0.0.1", Protocols: []string{"tcp"}, Notifications: "maybe"})
	require.ErrorIs(t, err, engine.ErrInvalidConfig)
}

// failingRegister wraps a real transport and fails AfterRegister while
// fail is set.
type failingRegister struct {
	transport.Transport
	fail *atomic.Bool
}

var errInjected = errors.New("injected registration failure")

func (f failingRegister) AfterRegister(r *transport.Region) error {
	if f.fail.Load() {
		return errInjected
	}
	return nil
}

// TestRegisterUndoneWhenATransportFails: rdma registers the buffer
// (MRs, keys), the next transport refuses it; rdma's MRs must be gone,
// the buffer not registered nor published, and registering again works.
func TestRegisterUndoneWhenATransportFails(t *testing.T) {
	var fail atomic.Bool
	restore := engine.SetTransportWrapper(func(tr transport.Transport) transport.Transport {
		if tr.Name() == "tcp" {
			return failingRegister{Transport: tr, fail: &fail}
		}
		return tr
	})
	f := soft.NewFabric()
	cfg := engine.Config{Protocols: []string{"rdma", "tcp"}}
	var devs []*soft.Device
	for i := 0; i < 2; i++ {
		d := f.NewDevice(fmt.Sprintf("undo_mlx5_%d", i), soft.Options{})
		t.Cleanup(func() { d.Close() })
		devs = append(devs, d)
		cfg.RDMA.Devices = append(cfg.RDMA.Devices, d)
	}
	a := newNode(t, 1<<20, cfg)
	restore()
	require.Equal(t, []string{"rdma", "tcp"}, a.e.Transports())
	mrs := func() (n int) {
		for _, d := range devs {
			n += d.Live().MRs
		}
		return n
	}
	before := mrs()
	require.Positive(t, before, "the node's own buffer is registered")

	p, err := mempool.New(mempool.Options{Size: 1 << 20, SlabSize: 1 << 20})
	require.NoError(t, err)
	defer p.Close()
	extra, err := p.Alloc(1 << 20)
	require.NoError(t, err)
	fail.Store(true)
	require.ErrorIs(t, a.e.RegisterMemory(extra, "cpu:0"), errInjected)
	require.Equal(t, before, mrs(), "rdma MRs left behind for memory whose registration failed")
	for _, b := range a.e.LocalDesc().Buffers {
		require.NotEqual(t, transport.AddrOf(extra), b.Addr, "failed buffer published")
	}
	require.ErrorIs(t, a.e.UnregisterMemory(context.Background(), extra), engine.ErrNotRegistered)

	fail.Store(false)
	require.NoError(t, a.e.RegisterMemory(extra, "cpu:0"))
	require.Greater(t, mrs(), before)
	require.NoError(t, a.e.UnregisterMemory(context.Background(), extra))
	require.Equal(t, before, mrs())
}

// TestUnregisterBusyRetry: a transfer holds the buffer past the
// unregister's ctx. The buffer leaves the published descriptor at once;
// a retry finds it (busy again, not ErrNotRegistered) and succeeds once
// the transfer ended.
func TestUnregisterBusyRetry(t *testing.T) {
	hs, err := httpmeta.Serve("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { hs.Close() })
	stall := newStallingTarget(t)
	ctx := context.Background()
	// The stalling target's descriptor, in the store.
	pub, err := metadata.Open(hs.URL(), metadata.Options{RPCAddr: stall.name})
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(ctx, &metadata.SegmentDesc{Name: stall.name, Protocol: "tcp",
		TCPDataPort: stall.ln.Addr().(*net.TCPAddr).Port, TCPProtoVersion: 2,
		Buffers: []metadata.Buffer{{Name: "cpu:0", Addr: stall.base, Length: 1 << 20}}}))

	a := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}, MetadataServer: hs.URL(), TransferTimeout: time.Second})
	published := func() bool {
		d, err := pub.Get(ctx, a.e.Name())
		require.NoError(t, err)
		for _, b := range d.Buffers {
			if b.Addr == a.addr(0) {
				return true
			}
		}
		return false
	}
	require.True(t, published())
	seg, err := a.e.OpenSegment(ctx, stall.name)
	require.NoError(t, err)
	id, _ := a.e.AllocateBatch(1)
	require.NoError(t, a.e.Submit(id, []engine.Request{{Op: engine.Write, Local: a.buf[:4096], Target: seg, TargetAddr: stall.base}}))

	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, a.e.UnregisterMemory(ended, a.buf), engine.ErrUnregisterBusy)
	require.False(t, published(), "a busy unregister left the buffer in the published descriptor")
	require.ErrorIs(t, a.e.UnregisterMemory(ended, a.buf), engine.ErrUnregisterBusy, "retry")
	require.ErrorIs(t, a.e.RegisterMemory(a.buf, "cpu:0"), engine.ErrAlreadyRegistered, "memory still in use registered again")

	st, _ := a.e.Wait(ctx, id) // ends TIMEOUT at TransferTimeout
	require.Equal(t, engine.Timeout, st.Status)
	eventually(t, 10*time.Second, func() bool { return a.e.FreeBatch(id) == nil })
	require.NoError(t, a.e.UnregisterMemory(ctx, a.buf))
	require.ErrorIs(t, a.e.UnregisterMemory(ctx, a.buf), engine.ErrNotRegistered)
	require.NoError(t, a.e.RegisterMemory(a.buf, "cpu:0"))
}
