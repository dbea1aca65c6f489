package master

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/errcode"
)

// TestRemoveByRegexBounds: hostile expressions are refused before any key
// is matched, with errors that do not echo them back.
func TestRemoveByRegexBounds(t *testing.T) {
	e := newEnv(t, nil)
	a := cl(1)
	e.mount(a, "host:1", 1<<20)
	e.put(a, "k1", 64, ReplicateConfig{})
	long := strings.Repeat("a", MaxRegexLen+1)
	for _, tc := range []struct {
		name, re, says string
	}{
		{"too long", long, "exceeds"},
		{"4 KB of repeats", strings.Repeat("(.*){1000}x", 400), "exceeds"},
		{"huge program", `(.*){1000}x`, "instructions"},
		{"many repeats", `(.*.*){600}`, "instructions"},
		{"bad syntax, long", "(" + strings.Repeat("b", MaxRegexLen-1), "missing closing )"},
		{"unbalanced, would change meaning once wrapped", `k1)|(x`, "unexpected )"},
	} {
		n, err := e.m.RemoveByRegex(tc.re, true)
		require.ErrorIs(t, err, errcode.ErrInvalidParams, tc.name)
		require.Zero(t, n)
		require.Contains(t, err.Error(), tc.says, tc.name)
		require.Less(t, len(err.Error()), 200, "%s: %q", tc.name, err)
	}
	require.True(t, e.exists("k1"))
	// At the bounds, it works.
	n, err := e.m.RemoveByRegex(strings.Repeat("k", MaxRegexLen), false)
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = e.m.RemoveByRegex(`k[0-9]`, false)
	require.NoError(t, err)
	require.Equal(t, uint64(1), n)
}

// stepClock moves forward by step at every reading, so a budget runs out
// after a known amount of work, whatever the machine's speed.
type stepClock struct {
	base time.Time
	n    atomic.Int64
	step time.Duration
}

func (c *stepClock) Now() time.Time { return c.base.Add(time.Duration(c.n.Add(1)) * c.step) }

// TestRemoveByRegexBudget: past its time budget RemoveByRegex stops,
// reports what it removed, and a second call goes on.
func TestRemoveByRegexBudget(t *testing.T) {
	clk := &stepClock{base: t0, step: time.Millisecond}
	e := newEnv(t, func(c *Config) { c.Clock = clk; c.Shards = 16; c.RegexBudget = 20 * time.Millisecond })
	a := cl(1)
	e.mount(a, "host:1", 8<<20)
	const n = 4000
	for i := range n {
		e.put(a, fmt.Sprintf("x/%d", i), 64, ReplicateConfig{})
	}
	got, err := e.m.RemoveByRegex(`x/.*`, true)
	require.ErrorIs(t, err, errcode.ErrRPCTimeout)
	require.Less(t, got, uint64(n))
	require.Contains(t, err.Error(), fmt.Sprintf("after removing %d keys", got))
	require.Equal(t, int64(n)-int64(got), e.m.Stats().Keys)
	checkInvariants(t, e.m)
	total := got
	for i := 0; total < n; i++ {
		require.Less(t, i, 1000, "no progress")
		got, err = e.m.RemoveByRegex(`x/.*`, true)
		if err != nil {
			require.ErrorIs(t, err, errcode.ErrRPCTimeout)
		}
		total += got
	}
	require.Equal(t, uint64(n), total)
	require.Zero(t, e.m.Stats().Keys)
}

// TestRemoveMatchingOutsideLocks: the matching runs with no shard lock
// held (here, while it is held up, a Get and a Put on the shard finish),
// and a key replaced or leased meanwhile is re-checked.
func TestRemoveMatchingOutsideLocks(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Shards = 1 })
	a := cl(1)
	e.mount(a, "host:1", 1<<20)
	e.put(a, "a", 64, ReplicateConfig{})
	e.put(a, "b", 64, ReplicateConfig{})
	inMatch, resume := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	done := make(chan uint64, 1)
	go func() {
		n, err := e.m.removeMatching(func(k string) bool {
			if first.CompareAndSwap(false, true) {
				close(inMatch)
				<-resume
			}
			return true
		}, false, nil)
		assert.NoError(t, err)
		done <- n
	}()
	<-inMatch
	within(t, "Get and Put while keys are matched", func() {
		_, _, err := e.m.GetReplicaList("b") // leased now: not removed
		assert.NoError(t, err)
		e.put(a, "c", 64, ReplicateConfig{}) // after the snapshot: not seen
	})
	close(resume)
	require.Equal(t, uint64(1), <-done)
	require.False(t, e.exists("a"))
	require.True(t, e.exists("b"))
	require.True(t, e.exists("c"))
	checkInvariants(t, e.m)
}
