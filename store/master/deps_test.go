package master

import (
	"testing"

	"github.com/crescent-kv/crescent/internal/depcheck"
)

// The core links no RPC, Prometheus or ZMQ: an HA follower embeds it. The
// adapters live in store/master/service, admin and kvevents.
func TestCoreLinksNoRPC(t *testing.T) {
	n := depcheck.Forbid(t, ".", []string{
		"google.golang.org/grpc",
		"github.com/prometheus",
		"github.com/go-zeromq/zmq4",
		"github.com/crescent-kv/crescent/store/storepb",
	}, nil, []string{"verbs", "fabric", "invariants"})
	t.Logf("store/master links %d packages", n)
}
