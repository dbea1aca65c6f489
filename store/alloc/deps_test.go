package alloc

import (
	"testing"

	"github.com/crescent-kv/crescent/internal/depcheck"
)

// The allocator is transport- and RPC-free: an HA follower and the master
// core embed it, so it must not bring gRPC or protobuf in (it once did,
// through store/errcode -> storepb).
func TestLinksNoRPC(t *testing.T) {
	n := depcheck.Forbid(t, ".", []string{
		"google.golang.org/grpc",
		"google.golang.org/protobuf",
		"github.com/crescent-kv/crescent/store/storepb",
		"github.com/crescent-kv/crescent/store/rpcerr",
	}, nil, []string{"verbs", "fabric", "invariants"})
	t.Logf("store/alloc links %d packages", n)
}
