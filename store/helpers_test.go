package store

import (
	"context"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// testMaster is a real master (store/master) served over gRPC on a
// loopback port.
type testMaster struct {
	m    *master.Master
	svc  *service.Service
	addr string
	stop func()
}

// startMaster serves a master of cfg, its service built with opts, until
// the test ends.
func startMaster(t testing.TB, cfg master.Config, opts ...service.Option) *testMaster {
	t.Helper()
	m, err := master.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tm := &testMaster{m: m, addr: lis.Addr().String()}
	tm.stop, tm.svc = serveMaster(t, m, lis, false, opts...)
	t.Cleanup(tm.stop)
	return tm
}

// serveMaster serves m on lis, gRPC only or (as crescent-master does)
// gRPC and crpc on the one port, with a service built with opts; the
// func returned stops it, once.
func serveMaster(t testing.TB, m *master.Master, lis net.Listener, grpcOnly bool, opts ...service.Option) (func(), *service.Service) {
	if !grpcOnly {
		opts = append([]service.Option{service.WithGracePeriod(100 * time.Millisecond)}, opts...)
	}
	svc := service.New(m, opts...)
	if grpcOnly {
		g := grpc.NewServer()
		svc.Register(g)
		served := make(chan struct{})
		go func() {
			defer close(served)
			g.Serve(lis)
		}()
		return sync.OnceFunc(func() {
			g.Stop()
			<-served
			m.Close()
		}), svc
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	return sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("master Serve: %v", err)
		}
		m.Close()
	}), svc
}

var quiet = slog.New(slog.DiscardHandler)

// newTestClient starts a client of tm contributing seg bytes, closed at
// the end of the test.
func newTestClient(t testing.TB, tm *testMaster, seg int64, mod ...func(*Config)) *Client {
	t.Helper()
	cfg := Config{
		MasterAddr: tm.addr, LocalHostname: "127.0.0.1", GlobalSegmentSize: seg,
		LocalBufferSize: 32 << 20, Logger: quiet,
	}
	for _, f := range mod {
		f(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return c
}

func protocols(p ...string) func(*Config) { return func(c *Config) { c.Protocols = p } }

// twoRPCPuts turns put-ahead off, for tests of the PutStart/PutEnd path
// and of exact space accounting (reservations hold space).
func twoRPCPuts(c *Config) { c.PutAhead = -1 }

// noRetries turns off placing a put again after a failed write, for
// tests of what a failed put leaves behind.
func noRetries(c *Config) { c.PutRetries = -1 }

// eventually polls cond until it holds or the (generous) deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openFds counts this process's open file descriptors.
func openFds(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// segmentOf returns the segment name each replica of key lives on.
func segmentsOf(t testing.TB, tm *testMaster, key string) []string {
	t.Helper()
	info, err := tm.m.QueryKey(key)
	if err != nil {
		t.Fatalf("QueryKey(%q): %v", key, err)
	}
	var out []string
	for _, r := range info.Replicas {
		out = append(out, r.SegmentName)
	}
	return out
}
