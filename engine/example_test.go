package engine_test

import (
	"context"
	"fmt"
	"log"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/transport"
)

// Two engines on loopback: one writes a block into the other's registered
// buffer and notifies it.
func Example() {
	ctx := context.Background()

	// The target: a pool outside the Go heap, registered with its engine.
	// (Defers run in reverse: engines close before their pools.)
	tpool, err := mempool.New(mempool.Options{Size: 16 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer tpool.Close()
	tbuf, err := tpool.Alloc(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	target, err := engine.New(engine.Config{LocalServerName: "127.0.0.1"})
	if err != nil {
		log.Fatal(err)
	}
	defer target.Close()
	if err := target.RegisterMemory(tbuf, "cpu:0"); err != nil {
		log.Fatal(err)
	}

	// The initiator.
	ipool, err := mempool.New(mempool.Options{Size: 16 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer ipool.Close()
	src, err := ipool.Alloc(4096)
	if err != nil {
		log.Fatal(err)
	}
	copy(src, "hello, KV cache")
	init, err := engine.New(engine.Config{LocalServerName: "127.0.0.1"})
	if err != nil {
		log.Fatal(err)
	}
	defer init.Close()
	if err := init.RegisterMemory(src, "cpu:0"); err != nil {
		log.Fatal(err)
	}

	// Open the target by name (P2P handshake: its host:port) and write.
	seg, err := init.OpenSegment(ctx, target.Name())
	if err != nil {
		log.Fatal(err)
	}
	defer init.CloseSegment(seg)
	batch, err := init.AllocateBatch(1)
	if err != nil {
		log.Fatal(err)
	}
	req := engine.Request{Op: engine.Write, Local: src, Target: seg, TargetAddr: transport.AddrOf(tbuf)}
	if err := init.SubmitWithNotify(batch, []engine.Request{req}, seg, "block 0 ready"); err != nil {
		log.Fatal(err)
	}
	st, err := init.Wait(ctx, batch)
	if err != nil {
		log.Fatal(err)
	}
	if err := init.FreeBatch(batch); err != nil {
		log.Fatal(err)
	}

	fmt.Println(st.Status, st.Transferred)
	fmt.Println(string(tbuf[:15]))
	for _, n := range target.Notifications() {
		fmt.Println(n.Msg)
	}
	// Output:
	// COMPLETED 4096
	// hello, KV cache
	// block 0 ready
}
