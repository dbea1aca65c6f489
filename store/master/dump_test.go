package master

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func dumpText(t *testing.T, m *Master) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, m.DumpState(&b))
	return b.String()
}

// TestDumpState: the dump is deterministic, is the same for a standby
// that replayed the log (another shard count), and tells states apart.
func TestDumpState(t *testing.T) {
	e := newEnv(t, nil)
	drive(t, e, 7, 2000, nil)
	a := dumpText(t, e.m)
	require.Equal(t, a, dumpText(t, e.m))
	for _, kind := range []string{"key ", "segment ", "reservation next=", "client "} {
		require.Contains(t, "\n"+a, "\n"+kind, "dump has no %q line", kind)
	}
	require.True(t, strings.HasSuffix(a, "\n"))

	standby, err := New(Config{Shards: 3, Clock: e.clk, Seed: 99})
	require.NoError(t, err)
	for i, op := range e.log.all() {
		require.NoError(t, standby.Replay(op), "op %d", i)
	}
	require.Equal(t, a, dumpText(t, standby))
	require.Empty(t, diffState(dumpState(e.m), dumpState(standby)))

	// One change shows.
	keys := e.m.AllKeys()
	require.NotEmpty(t, keys)
	require.NoError(t, standby.Remove(keys[0], true))
	b := dumpText(t, standby)
	require.NotEqual(t, a, b)
	require.Contains(t, a, "key \""+keys[0]+"\"")
	require.NotContains(t, b, "key \""+keys[0]+"\"")
}
