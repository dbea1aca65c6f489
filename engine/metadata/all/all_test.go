package all_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/crescent-kv/crescent/engine/metadata"
	_ "github.com/crescent-kv/crescent/engine/metadata/all"
)

func TestRegistersEveryBackend(t *testing.T) {
	assert.Equal(t, []string{"etcd", "http", "https", "redis", "rediss"}, metadata.Schemes())
}
