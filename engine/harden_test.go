package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/metadata"
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
