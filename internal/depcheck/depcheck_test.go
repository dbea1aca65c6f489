package depcheck

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestListAndChain(t *testing.T) {
	pkgs := List(t, ".")
	var paths []string
	for _, p := range pkgs {
		paths = append(paths, p.ImportPath)
	}
	require.Contains(t, paths, "github.com/crescent-kv/crescent/internal/depcheck")
	require.Contains(t, paths, "encoding/json")
	assert.NotContains(t, paths, "github.com/stretchr/testify/assert", "test-only imports are not linked")
	assert.Equal(t, "github.com/crescent-kv/crescent/internal/depcheck -> encoding/json", Chain(pkgs, "encoding/json"))
	assert.Contains(t, Chain(pkgs, "nosuch/pkg"), "no chain")
	// A prefix matches whole path elements only.
	assert.Positive(t, Forbid(t, ".", []string{"encoding/jso", "github.com/stretchr"}, nil, []string{"invariants"}))
}
