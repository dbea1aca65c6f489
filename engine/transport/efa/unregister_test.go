package efa

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine/transport"
)

// TestUnregisterBusyIsUnconfirmed: a buffer whose registrations a
// request still uses stays reachable by peers; BeforeUnregister says so
// with a channel that closes once its registrations are closed.
func TestUnregisterBusyIsUnconfirmed(t *testing.T) {
	tr := New(Config{})
	l := &localReg{addr: 0x1000, n: 4096, idle: make(chan struct{})}
	tr.regs[l.addr] = l
	require.True(t, l.acquire())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := tr.BeforeUnregister(ctx, l.addr, l.n)
	require.ErrorIs(t, err, transport.ErrBufferBusy)
	var ue *transport.UnconfirmedError
	require.True(t, errors.As(err, &ue), "%v", err)
	require.Len(t, ue.Released, 1)
	select {
	case <-ue.Released[0]:
		t.Fatal("released while a request still uses the registrations")
	default:
	}
	l.release()
	<-ue.Released[0]
	tr.bg.Stop()
}
