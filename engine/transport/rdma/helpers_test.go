package rdma_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma"
	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
	"github.com/crescent-kv/crescent/internal/testutil"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// node is one RDMA transport as an engine runs it: a handshake server
// naming the segment, a registry with one buffer from a memfd pool, and
// software NICs on a shared fabric.
type node struct {
	name string
	srv  *metadata.Server
	tr   *rdma.Transport
	reg  *transport.Registry
	pool *mempool.Pool
	buf  []byte
	devs []*soft.Device
	once sync.Once
}

type nodeOpts struct {
	nics int
	numa []int // NUMA node per NIC (default 0)
	size int
	cfg  rdma.Config
}

func newNode(tb testing.TB, f *soft.Fabric, o nodeOpts) *node {
	tb.Helper()
	if o.nics == 0 {
		o.nics = 1
	}
	if o.size == 0 {
		o.size = 8 << 20
	}
	srv, err := metadata.NewServer(metadata.ServerConfig{Addr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	n := &node{name: srv.Addr(), srv: srv}
	for i := range o.nics {
		numa := 0
		if i < len(o.numa) {
			numa = o.numa[i]
		}
		d := f.NewDevice("soft"+string(rune('0'+i)), soft.Options{NUMANode: numa})
		n.devs = append(n.devs, d)
		o.cfg.Devices = append(o.cfg.Devices, d)
	}
	pool, err := mempool.New(mempool.Options{Size: int64(o.size), SlabSize: 1 << 20, Name: "crescent-rdma-test"})
	if err != nil {
		tb.Fatal(err)
	}
	n.pool = pool
	if n.buf, err = pool.Alloc(o.size); err != nil {
		tb.Fatal(err)
	}
	n.reg = transport.NewRegistry()
	n.tr = rdma.New(o.cfg)
	tb.Cleanup(n.close)
	if err := n.tr.Start(transport.Env{LocalName: n.name, Host: "127.0.0.1", HostID: "h-" + n.name, Registry: n.reg, Logger: quiet, Handshake: testutil.Handshake{S: srv}}); err != nil {
		tb.Fatal(err)
	}
	r, err := n.reg.Add(n.buf, "cpu:0", -1, 0, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if err := n.tr.AfterRegister(r); err != nil {
		tb.Fatal(err)
	}
	return n
}

func (n *node) close() {
	n.once.Do(func() {
		n.tr.Close()
		n.srv.Close()
		n.reg.Close()
		n.pool.Close()
		for _, d := range n.devs {
			d.Close()
		}
	})
}

func (n *node) addr(off int) uint64 { return transport.AddrOf(n.buf) + uint64(off) }

// desc is what engine.LocalDesc publishes for this node.
func (n *node) desc() *metadata.SegmentDesc {
	d := &metadata.SegmentDesc{Name: n.name, Protocol: "tcp", Crescent: &metadata.Extension{Version: 1, Protocols: []string{"rdma"}}}
	for _, r := range n.reg.Regions() {
		d.Buffers = append(d.Buffers, metadata.Buffer{Name: r.Location, Addr: r.Addr, Length: r.Len()})
	}
	n.tr.Describe(d)
	return d
}

func (n *node) peer() transport.Peer { return &testPeer{name: n.name, desc: n.desc()} }

// devStats sums the software NICs' counters.
func (n *node) devStats() soft.Stats {
	var s soft.Stats
	for _, d := range n.devs {
		s = s.Add(d.Stats())
	}
	return s
}

// testPeer is an opened segment with a fixed descriptor.
type testPeer struct {
	name string
	desc *metadata.SegmentDesc
}

func (p *testPeer) Name() string                                           { return p.name }
func (p *testPeer) Desc() *metadata.SegmentDesc                            { return p.desc }
func (p *testPeer) Refresh(context.Context) (*metadata.SegmentDesc, error) { return p.desc, nil }

type result struct {
	n   int
	err error
	at  time.Time
}

// submit starts one task per (local, remote) pair and returns a channel
// delivering each task's result (in completion order).
func submit(n *node, p transport.Peer, op transport.Op, locals [][]byte, remotes []uint64, deadline time.Time) <-chan result {
	ch := make(chan result, len(locals))
	tasks := make([]*transport.Task, len(locals))
	for i := range locals {
		tasks[i] = transport.NewTask(op, locals[i], remotes[i], deadline, func(_ *transport.Task, k int, err error) {
			ch <- result{k, err, time.Now()}
		})
	}
	n.tr.Submit(p, tasks)
	return ch
}

// do runs tasks and waits for all of them.
func do(tb testing.TB, n *node, p transport.Peer, op transport.Op, locals [][]byte, remotes []uint64) []result {
	tb.Helper()
	ch := submit(n, p, op, locals, remotes, time.Now().Add(30*time.Second))
	out := make([]result, 0, len(locals))
	for range locals {
		select {
		case r := <-ch:
			out = append(out, r)
		case <-time.After(60 * time.Second):
			tb.Fatalf("tasks did not complete (%d of %d)", len(out), len(locals))
		}
	}
	return out
}

// transfer moves one range and fails the test on error.
func transfer(tb testing.TB, from *node, p transport.Peer, op transport.Op, off, size int, remote uint64) {
	tb.Helper()
	rs := do(tb, from, p, op, [][]byte{from.buf[off : off+size]}, []uint64{remote})
	if rs[0].err != nil || rs[0].n != size {
		tb.Fatalf("%v of %d bytes: n=%d err=%v", op, size, rs[0].n, rs[0].err)
	}
}

func mustEqual(tb testing.TB, what string, got, want []byte) {
	tb.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		tb.Fatalf("%s: data differs at byte %d of %d", what, i, len(want))
	}
}

// eventually polls cond until it holds or a generous timeout passes.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// qpsUsed counts a device's QPs that carried work.
func qpsUsed(d *soft.Device) int {
	n := 0
	for _, q := range d.QPs() {
		if q.Posted > 0 {
			n++
		}
	}
	return n
}

var _ rdmadev.Device = (*soft.Device)(nil)

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func mustMarshal(tb testing.TB, d *metadata.SegmentDesc) []byte {
	tb.Helper()
	b, err := d.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
