package engine_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/internal/depcheck"
)

// Metadata backends are opt-in imports: the engine alone links none of
// them, nor etcd's client, go-redis or gRPC (it once linked 396 packages
// through a blank import of all three).
func TestLinksNoMetadataBackends(t *testing.T) {
	n := depcheck.Forbid(t, ".", []string{
		"go.etcd.io/etcd",
		"github.com/redis/go-redis",
		"google.golang.org/grpc",
		"google.golang.org/protobuf",
		"github.com/crescent-kv/crescent/engine/metadata/etcdmeta",
		"github.com/crescent-kv/crescent/engine/metadata/redismeta",
		"github.com/crescent-kv/crescent/engine/metadata/httpmeta",
		"github.com/crescent-kv/crescent/engine/metadata/all",
	}, nil, []string{"verbs", "fabric", "invariants"})
	t.Logf("engine links %d packages", n)
}

// Without the import, a store backend's connection string is refused by
// New with the import to add. (This test binary links httpmeta, through
// another test, but neither etcdmeta nor redismeta.)
func TestNewMetadataSchemeNotRegistered(t *testing.T) {
	for conn, pkg := range map[string]string{
		"etcd://127.0.0.1:2379":  "engine/metadata/etcdmeta",
		"127.0.0.1:2379":         "engine/metadata/etcdmeta",
		"redis://127.0.0.1:6379": "engine/metadata/redismeta",
	} {
		e, err := engine.New(engine.Config{LocalServerName: "127.0.0.1", MetadataServer: conn, Protocols: []string{"tcp"}})
		require.Nil(t, e, conn)
		require.ErrorIs(t, err, engine.ErrInvalidConfig, conn)
		require.ErrorIs(t, err, metadata.ErrUnknownServer, conn)
		assert.Contains(t, err.Error(), `not registered: import _ "github.com/crescent-kv/crescent/`+pkg+`"`, conn)
	}
}

// A connection string's password must not reach the error (and so the
// logs).
func TestNewMetadataErrorHidesPassword(t *testing.T) {
	e, err := engine.New(engine.Config{LocalServerName: "127.0.0.1",
		MetadataServer: "redis://user:s3cr3t@127.0.0.1:6379", Protocols: []string{"tcp"}})
	require.Nil(t, e)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cr3t")
	assert.Contains(t, err.Error(), "redis://user:xxxxx@127.0.0.1:6379")
}
