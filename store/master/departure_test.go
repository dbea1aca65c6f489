package master

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCleanUnmountIsNotAnExpiry: a client that unmounts its segments (its
// Close) leaves at once; it is not active, not expired later, and what
// went with its segment is not counted as lost. A silent client is.
func TestCleanUnmountIsNotAnExpiry(t *testing.T) {
	var logs lockedBuffer
	e := newEnv(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	a, b := cl(1), cl(2)
	sa := e.mount(a, "host:a", 1<<20)
	e.mount(b, "host:b", 1<<20)
	for _, k := range []string{"a1", "a2", "a3"} {
		e.put(a, k, 1000, ReplicateConfig{Preferred: []string{"host:a"}})
	}
	for _, k := range []string{"b1", "b2"} {
		e.put(b, k, 1000, ReplicateConfig{Preferred: []string{"host:b"}})
	}
	require.Equal(t, 2, e.m.Stats().ActiveClients)

	require.NoError(t, e.m.UnmountSegment(a, sa.ID))
	st := e.m.Stats()
	require.Equal(t, 1, st.ActiveClients, "a client that left is not active")
	require.Equal(t, uint64(1), st.DepartedClients)
	require.Equal(t, uint64(3), st.UnmountedKeys)
	require.Equal(t, uint64(3), st.UnmountedReplicas)
	require.Zero(t, st.LostKeys)
	require.Zero(t, st.DroppedReplicas)
	require.Zero(t, st.ExpiredClients)
	_, status := e.m.Ping(a)
	require.Equal(t, ClientNeedRemount, status)

	// Both fall silent; only b is still tracked, so only b expires.
	e.clk.Advance(e.m.cfg.ClientTTL + 1)
	e.m.Tick()
	st = e.m.Stats()
	require.Zero(t, st.ActiveClients)
	require.Equal(t, uint64(1), st.ExpiredClients)
	require.Equal(t, uint64(2), st.LostKeys)
	require.Equal(t, uint64(2), st.DroppedReplicas)
	require.Equal(t, uint64(1), st.DepartedClients)
	require.Equal(t, uint64(3), st.UnmountedKeys)

	out := logs.String()
	var expired []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "client expired") {
			expired = append(expired, l)
		}
	}
	require.Len(t, expired, 1, out)
	require.Contains(t, expired[0], b.String())
	require.Contains(t, out, "unmounted its last segment")
	require.Contains(t, out, a.String())

	// The departure replays.
	standby, err := New(Config{Shards: 3, Clock: e.clk})
	require.NoError(t, err)
	for _, op := range e.log.all() {
		require.NoError(t, standby.Replay(op))
	}
	require.Empty(t, diffState(dumpState(e.m), dumpState(standby)))

	// A client that left mounts again like a new one.
	e.mount(a, "host:a", 1<<20)
	require.Equal(t, 1, e.m.Stats().ActiveClients)
}
