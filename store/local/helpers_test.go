package local

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

type testMaster struct {
	m    *master.Master
	addr string
}

func startMaster(t testing.TB) *testMaster {
	t.Helper()
	m, err := master.New(master.Config{})
	require.NoError(t, err)
	require.NoError(t, m.Start())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.New(m, service.WithGracePeriod(50*time.Millisecond)).Serve(ctx, lis) }()
	t.Cleanup(sync.OnceFunc(func() {
		cancel()
		<-done
		m.Close()
	}))
	return &testMaster{m: m, addr: lis.Addr().String()}
}

func newRealClient(t testing.TB, tm *testMaster) *store.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := store.New(ctx, store.Config{MasterAddr: tm.addr, LocalHostname: "127.0.0.1", GlobalSegmentSize: 64 << 20,
		LocalBufferSize: 16 << 20, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// serve starts a real client with a local server on a fresh socket.
func serve(t testing.TB, opts Options) (*Server, *store.Client, *testMaster) {
	t.Helper()
	tm := startMaster(t)
	c := newRealClient(t, tm)
	opts.Logger = quiet
	s, err := Serve(c, filepath.Join(t.TempDir(), "crescent.sock"), opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s, c, tm
}

func dial(t testing.TB, s *Server) *Dummy {
	t.Helper()
	d, err := Dial(tctx(t), s.Path())
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func shmCache() Options {
	return Options{CacheSize: 4 << 20, BlockSize: 1 << 20, Shm: true}
}
