package admin

import (
	"context"
	"net"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/master/service"
	"github.com/crescent-kv/crescent/store/storepb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve runs m's service on loopback (as the service's tests do) and
// returns a client of it.
func serve(t testing.TB, m *master.Master, opts ...service.Option) (storepb.MasterClient, *service.Service) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(m, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(mastertest.Sign))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return storepb.NewMasterClient(conn), svc
}

func pbID(u master.UUID) *storepb.UUID { return &storepb.UUID{High: u.Hi, Low: u.Lo} }
