package testsvc

import (
	"context"
	"net"
	"time"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/store/storepb"
)

// MasterReady dials a master's RPC port at addr with crpc (opts: TLS, the
// token) and asks ServiceReady, all within 5 s. A non-nil from is the
// local address to dial from (a veth address: a non-loopback peer).
func MasterReady(addr string, from net.IP, opts ...crpc.Option) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if from != nil {
		opts = append(opts, crpc.WithDialer(&net.Dialer{LocalAddr: &net.TCPAddr{IP: from}}))
	}
	cc, err := crpc.Dial(ctx, addr, opts...)
	if err != nil {
		return err
	}
	defer cc.Close()
	_, err = storepb.NewMasterClient(cc).ServiceReady(ctx, &storepb.ServiceReadyRequest{})
	return err
}
