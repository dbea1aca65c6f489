package store

import (
	"testing"

	"github.com/crescent-kv/crescent/internal/depcheck"
)

// The client needs gRPC for the master but no metadata backend: those are
// the program's choice (engine/metadata/all in crescent-client).
func TestLinksNoMetadataBackends(t *testing.T) {
	n := depcheck.Forbid(t, ".", []string{
		"go.etcd.io/etcd",
		"github.com/redis/go-redis",
		"github.com/crescent-kv/crescent/engine/metadata/etcdmeta",
		"github.com/crescent-kv/crescent/engine/metadata/redismeta",
		"github.com/crescent-kv/crescent/engine/metadata/httpmeta",
		"github.com/crescent-kv/crescent/engine/metadata/all",
	}, nil, []string{"verbs", "fabric", "invariants"})
	t.Logf("store links %d packages", n)
}
