package service_test

import (
	"context"
	"fmt"
	"net"

	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// Serving the master over gRPC; Start runs eviction and liveness.
func ExampleServe() {
	m, err := master.New(master.Config{})
	if err != nil {
		panic(err)
	}
	defer m.Close()
	if err := m.Start(); err != nil {
		panic(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a real server runs until SIGTERM cancels ctx
	fmt.Println(service.Serve(ctx, lis, m))
	// Output: <nil>
}
