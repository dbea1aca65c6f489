package ctl

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/event"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/admin"
	"github.com/crescent-kv/crescent/store/master/kvevents"
	"github.com/crescent-kv/crescent/store/master/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// cluster is a real master (RPC port, admin HTTP port, KV events with
// replay) and one client contributing a segment, all on loopback.
type cluster struct {
	m                *master.Master
	pub              *event.Publisher
	rpc, admin       string
	events, replay   string
	client           *store.Client
	segment, segName string
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	pub, err := event.NewPublisher(event.PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Mode: event.ModeBind, Logger: quiet,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pub.Close(ctx)
	})
	m, err := master.New(master.Config{Events: kvevents.New(pub), Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, m.Start())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	svc := service.New(m, service.WithGracePeriod(100*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		m.Close()
	})
	web := httptest.NewServer(admin.Handler(m, svc, prometheus.NewRegistry(), nil))
	t.Cleanup(web.Close)

	c := &cluster{m: m, pub: pub, rpc: lis.Addr().String(), admin: strings.TrimPrefix(web.URL, "http://"),
		events: pub.Endpoint(), replay: pub.ReplayEndpoint()}
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	c.client, err = store.New(sctx, store.Config{
		MasterAddr: c.rpc, LocalHostname: "127.0.0.1", GlobalSegmentSize: 32 << 20, LocalBufferSize: 8 << 20, Logger: quiet,
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.client.Close()) }) // before the master stops
	c.segName = c.client.SegmentName()
	return c
}

// result is one crescentctl run.
type result struct {
	code           int
	stdout, stderr string
}

// ctl runs crescentctl against c with args (after the address flags).
func (c *cluster) ctl(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	full := append([]string{"--master", c.rpc, "--admin", c.admin, "--local_hostname", "127.0.0.1", "--log_level", "error"}, args...)
	return runCtl(context.Background(), stdin, full...)
}

func runCtl(ctx context.Context, stdin string, args ...string) result {
	var out, errb bytes.Buffer
	var in io.Reader = strings.NewReader(stdin)
	code := Main(ctx, args, IO{Stdin: in, Stdout: &out, Stderr: &errb})
	return result{code, out.String(), errb.String()}
}
