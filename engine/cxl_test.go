package engine_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// Two engines configured with the same CXL device reach each other's
// device-resident buffers through it, and fall back to tcp for the rest.
func TestCXLThroughEngine(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "dax0.0")
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Truncate(dev, 8<<20)
	cfg := engine.Config{LocalServerName: "127.0.0.1", Protocols: []string{"cxl", "tcp"}}
	cfg.CXL.Path = dev
	a, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := a.Transports(); len(got) != 2 || got[0] != "cxl" {
		t.Fatalf("transports %v", got)
	}
	adev, _ := a.CXLDevice()
	bdev, _ := b.CXLDevice()
	local := adev.Bytes()[:1<<20]
	remote := bdev.Bytes()[4<<20 : 5<<20]
	// Registered but not on the device: tcp carries it. (Pool memory, not
	// the Go heap, which the race detector would watch.)
	pool, err := mempool.New(mempool.Options{Size: 1 << 20, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	heap, _ := pool.Alloc(4096)
	for _, err := range []error{a.RegisterMemory(local, ""), b.RegisterMemory(remote, ""), b.RegisterMemory(heap, "")} {
		if err != nil {
			t.Fatal(err)
		}
	}
	seg, err := a.OpenSegment(context.Background(), b.Name())
	if err != nil {
		t.Fatal(err)
	}
	d, _ := a.SegmentDesc(seg)
	if d.CXLName != "dax0.0" {
		t.Fatalf("descriptor %+v", d)
	}
	testutil.Fill(local, 9)
	id, _ := a.AllocateBatch(2)
	if err := a.Submit(id, []engine.Request{
		{Op: engine.Write, Local: local[:65536], Target: seg, TargetAddr: transport.AddrOf(remote) + 100},
		{Op: engine.Write, Local: local[65536 : 65536+4096], Target: seg, TargetAddr: transport.AddrOf(heap)},
	}); err != nil {
		t.Fatal(err)
	}
	wait(t, a, id)
	a.FreeBatch(id)
	if !bytes.Equal(remote[100:100+65536], local[:65536]) || !bytes.Equal(heap, local[65536:65536+4096]) {
		t.Fatal("bytes did not land")
	}
	// b's own mapping of the device sees a's write at the same offset.
	off, _ := bdev.Offset(remote)
	if !bytes.Equal(adev.Bytes()[off+100:off+100+65536], local[:65536]) {
		t.Fatal("a's mapping of the device does not show the write")
	}
}
