package metadata

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/auth"
)

func TestServerToken(t *testing.T) {
	token := []byte("0123456789abcdef0123456789abcdef")
	var mu sync.Mutex
	var notified []string
	s := startServer(t, ServerConfig{Token: token, Timeout: time.Second, Handlers: Handlers{
		Metadata: func() *SegmentDesc { return &SegmentDesc{Name: "seg", Protocol: "tcp"} },
		Notify: func(from, msg string) {
			mu.Lock()
			notified = append(notified, msg)
			mu.Unlock()
		},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	cl := Client{Token: token}
	d, err := cl.FetchDesc(ctx, s.Addr(), nil)
	require.NoError(t, err)
	require.Equal(t, "seg", d.Name)
	require.NoError(t, cl.SendProbe(ctx, s.Addr()))
	require.NoError(t, cl.SendNotify(ctx, s.Addr(), "me", "hello"))

	_, err = Client{Token: []byte("fedcba9876543210fedcba9876543210")}.FetchDesc(ctx, s.Addr(), nil)
	require.ErrorIs(t, err, auth.ErrRefused)
	require.Error(t, SendNotify(ctx, s.Addr(), "me", "unauthenticated"))
	_, err = FetchDesc(ctx, s.Addr(), nil)
	require.Error(t, err)
	mu.Lock()
	require.Equal(t, []string{"hello"}, notified, "only the authenticated notify arrived")
	mu.Unlock()

	// A server without a token refuses (cannot answer) a client with one.
	plain := startServer(t, ServerConfig{Timeout: time.Second})
	require.Error(t, cl.SendProbe(ctx, plain.Addr()))
}

func TestServerAllow(t *testing.T) {
	s := startServer(t, ServerConfig{Allow: func(net.Addr) bool { return false }})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.ErrorIs(t, SendProbe(ctx, s.Addr()), ErrNoReply)
	open := startServer(t, ServerConfig{Allow: auth.LoopbackOnly})
	require.NoError(t, SendProbe(ctx, open.Addr()))
}
