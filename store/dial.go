package store

import (
	"context"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// MasterConn is a connection to a master, gRPC or crpc, for
// storepb.NewMasterClient.
type MasterConn interface {
	grpc.ClientConnInterface
	io.Closer
}

// DialMaster connects to the master at addr as clients do: proto is
// "crpc", "grpc", or "auto" (or empty): crpc when the master answers it,
// else gRPC. It returns the connection and the protocol used; intercept,
// when not nil, sees every call.
func DialMaster(ctx context.Context, addr, proto string, intercept grpc.UnaryClientInterceptor) (MasterConn, string, error) {
	switch proto {
	case "", "auto", "crpc", "grpc":
	default:
		return nil, "", fmt.Errorf("%w: master protocol %q (want auto, crpc or grpc)", ErrInvalidConfig, proto)
	}
	if proto != "grpc" {
		var opts []crpc.Option
		if intercept != nil {
			opts = append(opts, crpc.WithUnaryInterceptor(intercept))
		}
		cc, err := crpc.Dial(ctx, addr, opts...)
		if err == nil {
			return cc, "crpc", nil
		}
		if proto == "crpc" {
			return nil, "", fmt.Errorf("store: master %s: %w", addr, errcode.FromStatus(err))
		}
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Batch answers for many keys exceed gRPC's 4 MiB default.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20), grpc.MaxCallSendMsgSize(256<<20)),
	}
	if intercept != nil {
		opts = append(opts, grpc.WithUnaryInterceptor(intercept))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, "", fmt.Errorf("%w: master address %q: %w", ErrInvalidConfig, addr, err)
	}
	return conn, "grpc", nil
}
