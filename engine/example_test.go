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
	tpool, _ := mempool.New(mempool.Options{Size: 16 << 20})
	defer tpool.Close()
	tbuf, _ := tpool.Alloc(1 << 20)
	target, err := engine.New(engine.Config{LocalServerName: "127.0.0.1"})
	if err != nil {
		log.Fatal(err)
	}
	defer target.Close()
	target.RegisterMemory(tbuf, "cpu:0")

	// The initiator.
	ipool, _ := mempool.New(mempool.Options{Size: 16 << 20})
	defer ipool.Close()
	src, _ := ipool.Alloc(4096)
	copy(src, "hello, KV cache")
	init, err := engine.New(engine.Config{LocalServerName: "127.0.0.1"})
	if err != nil {
		log.Fatal(err)
	}
	defer init.Close()
	init.RegisterMemory(src, "cpu:0")

	// Open the target by name (P2P handshake: its host:port) and write.
	seg, err := init.OpenSegment(ctx, target.Name())
	if err != nil {
		log.Fatal(err)
	}
	batch, _ := init.AllocateBatch(1)
	req := engine.Request{Op: engine.Write, Local: src, Target: seg, TargetAddr: transport.AddrOf(tbuf)}
	if err := init.SubmitWithNotify(batch, []engine.Request{req}, seg, "block 0 ready"); err != nil {
		log.Fatal(err)
	}
	st, err := init.Wait(ctx, batch)
	if err != nil {
		log.Fatal(err)
	}
	init.FreeBatch(batch)

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
