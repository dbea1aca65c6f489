package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/crescent-kv/crescent/engine/metadata"
)

// The engine leaves backends to its users; this binary takes them all.
func TestMetadataBackendsLinked(t *testing.T) {
	assert.Subset(t, metadata.Schemes(), []string{"etcd", "http", "https", "redis", "rediss"})
}
