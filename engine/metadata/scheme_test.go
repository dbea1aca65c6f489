package metadata

import (
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// This package alone registers no store backend: each unregistered scheme
// gets an error naming it and the import that provides it.
func TestOpenUnregisteredSchemeNamesImport(t *testing.T) {
	const pkg = "github.com/crescent-kv/crescent/engine/metadata/"
	for _, tc := range []struct{ conn, want string }{
		{"etcd://127.0.0.1:2379", `metadata: scheme "etcd" not registered: import _ "` + pkg + `etcdmeta"`},
		{"127.0.0.1:2379,127.0.0.1:2380", `metadata: scheme "etcd" (a connection string without scheme:// is an etcd endpoint list) not registered: import _ "` + pkg + `etcdmeta"`},
		{"redis://u:secret@127.0.0.1:6379/2", `metadata: scheme "redis" not registered: import _ "` + pkg + `redismeta"`},
		{"rediss://127.0.0.1:6379", `metadata: scheme "rediss" not registered: import _ "` + pkg + `redismeta"`},
		{"http://127.0.0.1:8080/metadata", `metadata: scheme "http" not registered: import _ "` + pkg + `httpmeta"`},
		{"https://127.0.0.1:8443/metadata", `metadata: scheme "https" not registered: import _ "` + pkg + `httpmeta"`},
	} {
		b, err := Open(tc.conn, Options{})
		require.Nil(t, b, tc.conn)
		require.ErrorIs(t, err, ErrUnknownServer, tc.conn)
		var se *SchemeError
		require.ErrorAs(t, err, &se, tc.conn)
		assert.Equal(t, tc.want, err.Error(), tc.conn)
		assert.NotContains(t, err.Error(), "secret", "the connection string (and its credentials) is not repeated")
	}
}

func TestOpenUnknownSchemeListsRegistered(t *testing.T) {
	Register("crescent-listed", func(string, Options) (Backend, error) { return nil, os.ErrInvalid })
	_, err := Open("nosuch://x:1", Options{})
	require.ErrorIs(t, err, ErrUnknownServer)
	assert.True(t, strings.HasPrefix(err.Error(), `metadata: scheme "nosuch" not registered (registered: P2PHANDSHAKE, `), err.Error())
	assert.Contains(t, err.Error(), "crescent-listed")
	assert.Contains(t, Schemes(), "crescent-listed")
	assert.NotContains(t, Schemes(), "etcd")
}

func TestRegisterRefusesBadSchemes(t *testing.T) {
	open := func(string, Options) (Backend, error) { return nil, nil }
	assert.Panics(t, func() { Register("", open) })
	assert.Panics(t, func() { Register("x://", open) })
	assert.Panics(t, func() { Register("x", nil) })
}

// Register and Open may race (a plugin loaded late, tests registering
// their own schemes); -race checks the registry is guarded.
func TestRegisterOpenConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for range 100 {
				if i%2 == 0 {
					Register("crescent-race", func(string, Options) (Backend, error) { return nil, os.ErrInvalid })
				} else {
					_, _ = Open("crescent-race://x", Options{})
					_ = Schemes()
				}
			}
		})
	}
	wg.Wait()
}

// Every backend Crescent ships has its import path on record for the
// error above; engine/metadata/all's test checks it registers them all.
func TestBackendPackagesKnown(t *testing.T) {
	assert.ElementsMatch(t, []string{"etcd", "http", "https", "redis", "rediss"}, slices.Collect(maps.Keys(backendPackages)))
	for s, p := range backendPackages {
		assert.True(t, strings.HasPrefix(p, "github.com/crescent-kv/crescent/engine/metadata/"), s)
	}
}
