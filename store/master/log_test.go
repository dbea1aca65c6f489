package master

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testlog"
)

// The master logs mounts, unmounts, client expiry and eviction rounds at
// info, one line each with ids and sizes, and finished puts at debug.
func TestLogLevels(t *testing.T) {
	h := &testlog.Capture{}
	e := newEnv(t, func(c *Config) { c.Logger = slog.New(h) })
	a, b := cl(1), cl(2)

	sa := e.mount(a, "a:1", 1<<20)
	got := h.Take("master: segment mounted")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelInfo, got[0].Level)
	require.Equal(t, sa.ID.String(), got[0].Attrs["segment"])
	require.Equal(t, a.String(), got[0].Attrs["client"])
	require.Equal(t, uint64(1<<20), got[0].Attrs["size"])

	e.put(a, "k", 4096, ReplicateConfig{Replicas: 1})
	got = h.Take("master: put")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelDebug, got[0].Level)
	require.Equal(t, "k", got[0].Attrs["key"])
	require.Equal(t, uint64(4096), got[0].Attrs["size"])
	require.Equal(t, int64(1), got[0].Attrs["replicas"])

	res := e.m.Evict()
	require.Equal(t, 1, res.Keys)
	got = h.Take("master: evicted")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelInfo, got[0].Level)
	require.Equal(t, int64(1), got[0].Attrs["keys"])
	require.Equal(t, res.Bytes, got[0].Attrs["size"])

	// A round that frees nothing repeats under pressure: debug.
	e.m.Evict()
	got = h.Take("master: evicted")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelDebug, got[0].Level)

	require.NoError(t, e.m.UnmountSegment(a, sa.ID))
	got = h.Take("master: segment unmounted")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelInfo, got[0].Level)
	require.Equal(t, sa.ID.String(), got[0].Attrs["segment"])
	require.Equal(t, uint64(1<<20), got[0].Attrs["size"])

	e.mount(b, "b:1", 1<<20)
	e.mount(b, "b:2", 2<<20)
	h.Take("")
	e.clk.Advance(e.m.cfg.ClientTTL + 1)
	e.m.Tick()
	got = h.Take("master: client expired; its segments unmounted")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelInfo, got[0].Level)
	require.Equal(t, b.String(), got[0].Attrs["client"])
	require.Equal(t, int64(2), got[0].Attrs["segments"])
	require.Equal(t, uint64(3<<20), got[0].Attrs["size"])
}
