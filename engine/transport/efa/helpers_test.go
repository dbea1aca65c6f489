package efa_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/efa"
	"github.com/crescent-kv/crescent/internal/fabric"
	"github.com/crescent-kv/crescent/internal/fabric/fabrictest"
	"github.com/crescent-kv/crescent/internal/testutil"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild()
		return
	}
	goleak.VerifyTestMain(m)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// needFabric skips (or, under CRESCENT_REQUIRE_DEPS=1, fails) when this
// build or host cannot run libfabric.
func needFabric(t testing.TB) {
	t.Helper()
	msg := ""
	if !fabric.Built {
		msg = "built without the fabric tag (needs cgo and libfabric-dev: run make deps, then go test -tags fabric)"
	} else if err := fabric.Load(""); err != nil {
		msg = err.Error() + " (run make deps)"
	}
	if msg == "" {
		return
	}
	if os.Getenv("CRESCENT_REQUIRE_DEPS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// providers are the libfabric software providers the tests run the
// transport on; CRESCENT_FI_PROVIDERS (comma-separated) overrides.
func providers() []string { return fabrictest.Providers("tcp;ofi_rxm", "sockets") }

// needProvider skips a provider this libfabric lacks (fails under
// CRESCENT_REQUIRE_DEPS=1).
func needProvider(t testing.TB, prov string) {
	t.Helper()
	if _, err := fabric.Discover(prov, 0); err != nil {
		if os.Getenv("CRESCENT_REQUIRE_DEPS") == "1" {
			t.Fatalf("provider %q: %v", prov, err)
		}
		t.Skipf("provider %q: %v (run make deps)", prov, err)
	}
}

// node is one efa transport serving one registered buffer from a memfd
// pool, named (as in P2P mode) after its handshake server's address.
type node struct {
	name string
	tr   *efa.Transport
	reg  *transport.Registry
	pool *mempool.Pool
	buf  []byte
	srv  *metadata.Server
	once sync.Once
}

func newNode(t testing.TB, prov string, size int, cfg efa.Config) *node {
	t.Helper()
	n := startNode(t, prov, size, cfg)
	t.Cleanup(n.close)
	return n
}

func startNode(t testing.TB, prov string, size int, cfg efa.Config) *node {
	t.Helper()
	srv, err := metadata.NewServer(metadata.ServerConfig{Addr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := mempool.New(mempool.Options{Size: int64(size), SlabSize: 1 << 20, Name: "crescent-efa-test"})
	if err != nil {
		srv.Close()
		t.Fatal(err)
	}
	buf, err := pool.Alloc(size)
	if err != nil {
		srv.Close()
		pool.Close()
		t.Fatal(err)
	}
	reg := transport.NewRegistry()
	fd, off, p, _ := mempool.Lookup(buf)
	if _, err := reg.Add(buf, "cpu:0", fd, off, p.Size()); err != nil {
		srv.Close()
		pool.Close()
		t.Fatal(err)
	}
	cfg.Provider = prov
	tr := efa.New(cfg)
	name := srv.Addr()
	if err := tr.Start(transport.Env{LocalName: name, Host: "127.0.0.1", HostID: "h", Registry: reg, Logger: quiet, Handshake: testutil.Handshake{S: srv}}); err != nil {
		srv.Close()
		reg.Close()
		pool.Close()
		t.Fatal(err)
	}
	return &node{name: name, tr: tr, reg: reg, pool: pool, buf: buf, srv: srv}
}

func (n *node) close() {
	n.once.Do(func() {
		n.tr.Close()
		n.srv.Close()
		n.reg.Close()
		n.pool.Close()
	})
}

func (n *node) addr(off int) uint64 { return transport.AddrOf(n.buf) + uint64(off) }

// desc is what an engine publishes for this node.
func (n *node) desc() *metadata.SegmentDesc {
	d := &metadata.SegmentDesc{Name: n.name, Protocol: "tcp", Crescent: &metadata.Extension{Version: 1, HostID: "h", Protocols: []string{efa.Protocol}}}
	for _, r := range n.reg.Regions() {
		d.Buffers = append(d.Buffers, metadata.Buffer{Name: r.Location, Addr: r.Addr, Length: r.Len()})
	}
	n.tr.Describe(d)
	return d
}

// peer is n as its peers see it; the descriptor is fetched once, as an
// engine caches it.
func (n *node) peer() *testPeer {
	d := n.desc()
	return &testPeer{name: n.name, desc: func() *metadata.SegmentDesc { return d }}
}

type testPeer struct {
	name string
	desc func() *metadata.SegmentDesc
}

func (p *testPeer) Name() string                { return p.name }
func (p *testPeer) Desc() *metadata.SegmentDesc { return p.desc() }
func (p *testPeer) Refresh(context.Context) (*metadata.SegmentDesc, error) {
	return p.desc(), nil
}

type result struct {
	n   int
	err error
}

// submit runs tasks to completion and returns their outcomes, failing
// the test if any task is not completed by limit.
func submit(t testing.TB, from *node, p transport.Peer, tasks []*transport.Task, results chan result, limit time.Duration) []result {
	t.Helper()
	from.tr.Submit(p, tasks)
	return collect(t, results, len(tasks), limit)
}

func collect(t testing.TB, results chan result, n int, limit time.Duration) []result {
	t.Helper()
	out := make([]result, 0, n)
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for len(out) < n {
		select {
		case r := <-results:
			out = append(out, r)
		case <-timer.C:
			t.Fatalf("%d of %d tasks not completed after %v", n-len(out), n, limit)
		}
	}
	return out
}

// task makes a task reporting on results.
func task(results chan result, op transport.Op, local []byte, remote uint64, deadline time.Time) *transport.Task {
	var once sync.Once
	return transport.NewTask(op, local, remote, deadline, func(_ *transport.Task, n int, err error) {
		done := false
		once.Do(func() { done = true })
		if !done {
			panic("task completed twice")
		}
		results <- result{n, err}
	})
}

// openFDs counts this process's open file descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
