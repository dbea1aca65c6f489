package store_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// A master on loopback, a client contributing memory, and a pure client
// that stores and reads a value.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// An in-process master, served as crescent-master serves it (gRPC
	// and crpc on one port). Without HA or an operation log this is the
	// whole master: for tests and single-process deployments.
	m, err := master.New(master.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Start(); err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- service.New(m).Serve(ctx, lis) }()
	defer func() {
		cancel() // stops Serve, after the clients closed (defers run in reverse)
		if err := <-served; err != nil {
			log.Print(err)
		}
	}()

	// A client that contributes 64 MiB to the pool (normally the
	// crescent-client daemon).
	owner, err := store.New(ctx, store.Config{
		MasterAddr: lis.Addr().String(), LocalHostname: "127.0.0.1",
		GlobalSegmentSize: 64 << 20, LocalBufferSize: 16 << 20,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer owner.Close()

	// An application's client: contributes nothing, reads and writes.
	c, err := store.New(ctx, store.Config{MasterAddr: lis.Addr().String(), LocalHostname: "127.0.0.1", LocalBufferSize: 16 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if err := c.Put(ctx, "layer0/block42", []byte("kv cache bytes"), store.ReplicateConfig{}); err != nil {
		log.Fatal(err)
	}
	v, err := c.Get(ctx, "layer0/block42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(v))

	err = c.Put(ctx, "layer0/block42", []byte("again"), store.ReplicateConfig{})
	fmt.Println(errors.Is(err, errcode.ErrObjectAlreadyExists))
	_, err = c.Get(ctx, "layer0/block43")
	fmt.Println(errors.Is(err, errcode.ErrObjectNotFound))
	// Output:
	// kv cache bytes
	// true
	// true
}
