package local

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestApplyEnv: the reference's variables set the cache; bad values name
// the variable.
func TestApplyEnv(t *testing.T) {
	t.Setenv(EnvCacheSize, "8gb")
	t.Setenv(EnvBlockSize, "2 MiB")
	t.Setenv(EnvUseShm, "1")
	t.Setenv(EnvAdmission, "3")
	var o Options
	require.NoError(t, o.ApplyEnv())
	require.Equal(t, Options{CacheSize: 8 << 30, BlockSize: 2 << 20, Shm: true, AdmissionThreshold: 3}, o)
	for _, tc := range []struct{ env, val string }{
		{EnvCacheSize, "lots"}, {EnvBlockSize, "0"}, {EnvUseShm, "maybe"}, {EnvAdmission, "16"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(tc.env, tc.val)
			var o Options
			require.ErrorContains(t, o.ApplyEnv(), tc.env)
		})
	}
}

// TestOptionsChecked: sizes that cannot work are refused at Serve.
func TestOptionsChecked(t *testing.T) {
	for _, o := range []Options{
		{CacheSize: 1 << 20, BlockSize: 2 << 20},
		{CacheSize: -1},
		{BlockSize: MaxInline + 1},
		{PingInterval: 10e9, ExpireAfter: 5e9},
	} {
		_, err := Serve(nil, t.TempDir()+"/s", o)
		require.Error(t, err, "%+v", o)
	}
}
