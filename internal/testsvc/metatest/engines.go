package metatest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/testutil"
)

type node struct {
	e    *engine.Engine
	pool *mempool.Pool
	buf  []byte
}

func newNode(t *testing.T, cfg Config, size int) *node {
	t.Helper()
	p, err := mempool.New(mempool.Options{Size: int64(size), SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	buf, err := p.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{
		LocalServerName: "127.0.0.1",
		MetadataServer:  cfg.Conn,
		Protocols:       []string{"tcp"}, // bytes cross a socket, found through the store
		MetadataTimeout: 10 * time.Second,
		MetadataTTL:     TTL,
	})
	if err != nil {
		t.Fatalf("engine.New with %s: %v", cfg.Conn, err)
	}
	t.Cleanup(func() { e.Close() })
	if err := e.RegisterMemory(buf, "cpu:0"); err != nil {
		t.Fatal(err)
	}
	return &node{e: e, pool: p, buf: buf}
}

func (n *node) addr(off int) uint64 { return transport.AddrOf(n.buf) + uint64(off) }

func run(t *testing.T, e *engine.Engine, reqs []engine.Request, notifyTo engine.SegmentID, msg string) {
	t.Helper()
	id, err := e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	defer e.FreeBatch(id)
	if msg != "" {
		err = e.SubmitWithNotify(id, reqs, notifyTo, msg)
	} else {
		err = e.Submit(id, reqs)
	}
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), Wait)
	defer cancel()
	st, err := e.Wait(c, id)
	if err != nil || st.Status != engine.Completed || st.NotifyErr != nil {
		t.Fatalf("batch: %+v %v", st, err)
	}
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	end := time.Now().Add(Wait)
	for !f() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, Wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RunEngines starts two engines on the store, has one open the other by
// name, moves bytes both ways, notifies through rpc_meta, and checks how
// descriptor changes reach the opener.
func RunEngines(t *testing.T, cfg Config) {
	c := ctx(t)
	a := newNode(t, cfg, 4<<20)
	b := newNode(t, cfg, 4<<20)

	// b's entries, as the reference names and writes them.
	host, port, _ := net.SplitHostPort(b.e.Name())
	cfg.wantValue(t, "mooncake/rpc_meta/"+b.e.Name(), []byte(`{"ip_or_host_name":"`+host+`","rpc_port":`+port+"}\n"))
	raw, ok := cfg.Raw.Get(t, "mooncake/ram/"+b.e.Name())
	if !ok {
		t.Fatal("descriptor not published")
	}
	if d, err := metadata.UnmarshalDesc(raw); err != nil || d.Name != b.e.Name() || len(d.Buffers) != 1 || d.Buffers[0].Addr != b.addr(0) {
		t.Fatalf("published descriptor %s: %v", raw, err)
	}

	seg, err := a.e.OpenSegment(c, b.e.Name())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Fill(a.buf[:1<<20], 1)
	run(t, a.e, []engine.Request{{Op: engine.Write, Local: a.buf[:1<<20], Target: seg, TargetAddr: b.addr(4096)}}, seg, "written")
	if !bytes.Equal(b.buf[4096:4096+1<<20], a.buf[:1<<20]) {
		t.Fatal("written bytes differ")
	}
	got := b.e.Notifications()
	if len(got) != 1 || got[0].Msg != "written" || got[0].From != a.e.Name() {
		t.Fatalf("notifications %+v", got)
	}
	run(t, a.e, []engine.Request{{Op: engine.Read, Local: a.buf[2<<20 : 3<<20], Target: seg, TargetAddr: b.addr(4096)}}, 0, "")
	if !bytes.Equal(a.buf[2<<20:3<<20], a.buf[:1<<20]) {
		t.Fatal("read bytes differ")
	}

	if _, err := a.e.OpenSegment(c, "127.0.0.1:1"); !errors.Is(err, engine.ErrSegmentNotFound) || !errors.Is(err, metadata.ErrNotFound) {
		t.Fatalf("open of an unknown segment: %v", err)
	}

	// b registers more memory: a watching opener learns it without a
	// request or a poll (SegmentRefresh is off).
	p2, err := mempool.New(mempool.Options{Size: 1 << 20, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	extra, _ := p2.Alloc(1 << 20)
	if err := b.e.RegisterMemory(extra, "cpu:0"); err != nil {
		t.Fatal(err)
	}
	descBufs := func() int {
		d, err := a.e.SegmentDesc(seg)
		if err != nil {
			t.Fatal(err)
		}
		return len(d.Buffers)
	}
	if cfg.Watches {
		eventually(t, "watch reports the new buffer", func() bool { return descBufs() == 2 })
	}
	// Either way, a request for the new buffer finds it.
	run(t, a.e, []engine.Request{{Op: engine.Write, Local: a.buf[:100], Target: seg, TargetAddr: transport.AddrOf(extra)}}, 0, "")
	if !bytes.Equal(extra[:100], a.buf[:100]) {
		t.Fatal("bytes to the new buffer differ")
	}
	if err := b.e.UnregisterMemory(c, extra); err != nil {
		t.Fatal(err)
	}

	name := b.e.Name()
	if err := b.e.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	cfg.wantAbsent(t, "mooncake/ram/"+name)
	cfg.wantAbsent(t, "mooncake/rpc_meta/"+name)
	if cfg.Watches {
		eventually(t, "watch drops the closed segment", func() bool { return descBufs() == 0 })
	}
	id, _ := a.e.AllocateBatch(1)
	defer a.e.FreeBatch(id)
	err = a.e.Submit(id, []engine.Request{{Op: engine.Write, Local: a.buf[:10], Target: seg, TargetAddr: b.addr(0)}})
	switch {
	case cfg.Watches && !errors.Is(err, engine.ErrOutOfBounds):
		// The dropped descriptor refuses the request up front.
		t.Fatalf("write to a withdrawn segment: %v, want ErrOutOfBounds", err)
	case err == nil:
		// Without a watch the cached descriptor still offers the range;
		// the transport then fails to reach the closed peer.
		st, _ := a.e.Wait(c, id)
		if st.Status == engine.Completed {
			t.Fatalf("write to a closed segment completed: %+v", st)
		}
	}
	if err := a.e.CloseSegment(seg); err != nil {
		t.Fatal(err)
	}
}
