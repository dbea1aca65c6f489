package leader_test

import (
	"context"
	"fmt"
	"log"

	"github.com/crescent-kv/crescent/ha/leader"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A master campaigns on etcd and stops serving when leadership ends.
func Example() {
	cli, err := clientv3.New(leader.EtcdClientConfig([]string{"127.0.0.1:2379"}))
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	c, err := leader.NewEtcd(cli, "prod")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	s, view, err := c.TryAcquire(ctx, "10.0.0.1:50051")
	if err != nil {
		log.Fatal(err)
	}
	if s == nil {
		fmt.Println("standby; leader is", view.Leader)
		return
	}
	leader.Monitor(s, func(reason error) { log.Printf("stop serving: %v", reason) })
	fmt.Println("leading with term", s.Term())
	defer s.Release(ctx)
}
