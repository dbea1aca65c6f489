package master

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// captured keeps every record a logger is given, at every level.
type captured struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (c *captured) Enabled(context.Context, slog.Level) bool { return true }
func (c *captured) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *captured) WithGroup(string) slog.Handler            { return c }
func (c *captured) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	c.recs = append(c.recs, r.Clone())
	c.mu.Unlock()
	return nil
}

// take returns the records with message msg since the last take, as
// level and attributes, and forgets all records.
func (c *captured) take(msg string) (out []logLine) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.recs {
		if r.Message != msg {
			continue
		}
		l := logLine{level: r.Level, attrs: map[string]any{}}
		r.Attrs(func(a slog.Attr) bool {
			l.attrs[a.Key] = a.Value.Any()
			return true
		})
		out = append(out, l)
	}
	c.recs = nil
	return out
}

type logLine struct {
	level slog.Level
	attrs map[string]any
}

// The master logs mounts, unmounts, client expiry and eviction rounds at
// info, one line each with ids and sizes, and finished puts at debug.
func TestLogLevels(t *testing.T) {
	h := &captured{}
	e := newEnv(t, func(c *Config) { c.Logger = slog.New(h) })
	a, b := cl(1), cl(2)

	sa := e.mount(a, "a:1", 1<<20)
	got := h.take("master: segment mounted")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelInfo, got[0].level)
	require.Equal(t, sa.ID.String(), got[0].attrs["segment"])
	require.Equal(t, a.String(), got[0].attrs["client"])
	require.Equal(t, uint64(1<<20), got[0].attrs["size"])

	e.put(a, "k", 4096, ReplicateConfig{Replicas: 1})
	got = h.take("master: put")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelDebug, got[0].level)
	require.Equal(t, "k", got[0].attrs["key"])
	require.Equal(t, uint64(4096), got[0].attrs["size"])
	require.Equal(t, int64(1), got[0].attrs["replicas"])

	res := e.m.Evict()
	require.Equal(t, 1, res.Keys)
	got = h.take("master: evicted")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelInfo, got[0].level)
	require.Equal(t, int64(1), got[0].attrs["keys"])
	require.Equal(t, res.Bytes, got[0].attrs["size"])

	// A round that frees nothing repeats under pressure: debug.
	e.m.Evict()
	got = h.take("master: evicted")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelDebug, got[0].level)

	require.NoError(t, e.m.UnmountSegment(a, sa.ID))
	got = h.take("master: segment unmounted")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelInfo, got[0].level)
	require.Equal(t, sa.ID.String(), got[0].attrs["segment"])
	require.Equal(t, uint64(1<<20), got[0].attrs["size"])

	e.mount(b, "b:1", 1<<20)
	e.mount(b, "b:2", 2<<20)
	h.take("")
	e.clk.Advance(e.m.cfg.ClientTTL + 1)
	e.m.Tick()
	got = h.take("master: client expired; its segments unmounted")
	require.Len(t, got, 1)
	require.Equal(t, slog.LevelInfo, got[0].level)
	require.Equal(t, b.String(), got[0].attrs["client"])
	require.Equal(t, int64(2), got[0].attrs["segments"])
	require.Equal(t, uint64(3<<20), got[0].attrs["size"])
}
