package master

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/errcode"
)

// subscribe starts a subscription and returns its id.
func subscribe(t *testing.T, m *Master) uint64 {
	t.Helper()
	b, err := m.WaitInvalidations(context.Background(), InvalidationPoll{})
	require.NoError(t, err)
	require.True(t, b.Reset)
	require.NotZero(t, b.Sub)
	return b.Sub
}

// subscribedKey is a master with InvalidationTTL ttl, a subscription,
// and a complete object "k" of client c.
func subscribedKey(t *testing.T, ttl time.Duration) (e *env, c UUID, sub uint64) {
	t.Helper()
	e = newEnv(t, func(cfg *Config) { cfg.InvalidationTTL = ttl })
	c = cl(1)
	e.mount(c, "a", 1<<20)
	sub = subscribe(t, e.m)
	e.put(c, "k", 100, ReplicateConfig{})
	return e, c, sub
}

// poll answers at once when something is queued (Wait 0).
func poll(t *testing.T, m *Master, sub, ack uint64, max int) InvalidationBatch {
	t.Helper()
	b, err := m.WaitInvalidations(context.Background(), InvalidationPoll{Sub: sub, Ack: ack, MaxItems: max})
	require.NoError(t, err)
	return b
}

// TestInvalidationsOfEveryRemoval: forced removes, RemoveAll, eviction and
// lost replicas queue (key, generation), numbered without gaps; unfinished
// puts do not.
func TestInvalidationsOfEveryRemoval(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.InvalidationTTL = 50 * time.Millisecond })
	c := cl(1)
	seg := e.mount(c, "a", 1<<20)
	sub := subscribe(t, e.m)
	e.put(c, "k1", 100, ReplicateConfig{})
	e.put(c, "k2", 100, ReplicateConfig{})
	e.put(c, "k3", 100, ReplicateConfig{})
	_, err := e.m.PutStart(c, "pending", 100, ReplicateConfig{})
	require.NoError(t, err)
	_, _, err = e.m.GetReplicaList("k1")
	require.NoError(t, err)
	require.NoError(t, e.m.Remove("k1", true)) // leased: forced
	e.clk.Advance(time.Hour)                   // leases over
	e.m.Evict()
	b := poll(t, e.m, sub, 0, 0)
	require.False(t, b.Reset)
	require.EqualValues(t, 1, b.First)
	keys := map[string]bool{}
	for _, it := range b.Items {
		keys[it.Key] = true
		assert.NotZero(t, it.Gen)
	}
	assert.True(t, keys["k1"])
	assert.False(t, keys["pending"])
	assert.EqualValues(t, len(b.Items), b.Last)
	last := b.Last
	e.put(c, "k4", 100, ReplicateConfig{})
	_, err = e.m.RemoveAll(true)
	require.NoError(t, err)
	e.put(c, "k5", 100, ReplicateConfig{})
	require.NoError(t, e.m.UnmountSegment(c, seg.ID)) // k5 goes with its segment
	b = poll(t, e.m, sub, last, 0)
	require.Equal(t, last+1, b.First)
	var got []string
	for _, it := range b.Items {
		got = append(got, it.Key)
	}
	assert.Contains(t, got, "k4")
	assert.Contains(t, got, "k5")
	assert.NotContains(t, got, "pending")
}

// TestInvalidationBarrier: a remove answers once the subscriber
// acknowledged it; with a subscriber that does not answer, after
// InvalidationTTL.
func TestInvalidationBarrier(t *testing.T) {
	e, c, sub := subscribedKey(t, 200*time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- e.m.Remove("k", true) }()
	var b InvalidationBatch
	for len(b.Items) == 0 { // polls are held at most a third of the TTL
		var err error
		b, err = e.m.WaitInvalidations(context.Background(), InvalidationPoll{Sub: sub, Wait: time.Hour})
		require.NoError(t, err)
	}
	require.Len(t, b.Items, 1)
	select {
	case err := <-done:
		t.Fatalf("the remove answered (%v) before the subscriber acknowledged", err)
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // acknowledge only
	_, err := e.m.WaitInvalidations(ctx, InvalidationPoll{Sub: sub, Ack: b.Last})
	require.NoError(t, err)
	require.NoError(t, <-done)
	assert.Zero(t, e.m.InvalidationTimeouts())

	// Nobody acknowledges now: the remove still answers, after the TTL.
	e.put(c, "k", 100, ReplicateConfig{})
	require.NoError(t, e.m.Remove("k", true))
	assert.EqualValues(t, 1, e.m.InvalidationTimeouts())
	// The subscriber has been silent for a TTL since: its freshness is
	// over, so a put's end does not wait for it.
	e.put(c, "k", 100, ReplicateConfig{})
	assert.EqualValues(t, 1, e.m.InvalidationTimeouts())
	// One that polls but does not acknowledge is waited for.
	_, err = e.m.WaitInvalidations(ctx, InvalidationPoll{Sub: sub, Ack: b.Last})
	require.NoError(t, err)
	require.NoError(t, e.m.Remove("k", true))
	assert.EqualValues(t, 2, e.m.InvalidationTimeouts())
}

// TestInvalidationUnsubscribe: a subscriber that unsubscribes is
// forgotten at once, and a barrier waiting for it returns.
func TestInvalidationUnsubscribe(t *testing.T) {
	e, c, sub := subscribedKey(t, time.Minute)
	done := make(chan error, 1)
	go func() { done <- e.m.Remove("k", true) }()
	require.Eventually(t, func() bool { return poll(t, e.m, sub, 0, 0).Last > 0 }, 10*time.Second, time.Millisecond,
		"the remove's invalidation queued")
	select {
	case err := <-done:
		t.Fatalf("the remove answered (%v) before the subscriber acknowledged or left", err)
	default:
	}
	b, err := e.m.WaitInvalidations(context.Background(), InvalidationPoll{Sub: sub, Unsubscribe: true})
	require.NoError(t, err)
	assert.Empty(t, b.Items)
	require.NoError(t, <-done)
	assert.Zero(t, e.m.InvalidationTimeouts())
	e.put(c, "k", 100, ReplicateConfig{}) // nothing to wait for
	assert.Zero(t, e.m.InvalidationTimeouts())
	b = poll(t, e.m, sub, 0, 0) // a poll of the ended subscription starts a new one
	assert.True(t, b.Reset)
	assert.NotEqual(t, sub, b.Sub)
}

// TestInvalidationBounds: an overflowing queue, a bad ack and a bounded
// answer.
func TestInvalidationBounds(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.InvalidationTTL = 5 * time.Second })
	c := cl(1)
	e.mount(c, "a", 64<<20)
	sub := subscribe(t, e.m)
	// Puts first: a put's end would wait for the acknowledgements.
	for i := range MaxInvalidationItems + 10 {
		e.put(c, fmt.Sprint("k", i), 64, ReplicateConfig{})
	}
	for i := range MaxInvalidationItems + 10 {
		require.NoError(t, e.m.remove(fmt.Sprint("k", i), true)) // no barrier: nobody acknowledges here
	}
	b := poll(t, e.m, sub, 0, 0)
	require.Len(t, b.Items, MaxInvalidationItems)
	require.True(t, b.More)
	b = poll(t, e.m, sub, 0, 5) // the same again, fewer
	require.Len(t, b.Items, 5)
	require.EqualValues(t, 1, b.First)

	b = poll(t, e.m, sub, 1<<40, 0) // acknowledges what was never sent
	require.True(t, b.Reset)
	last := b.Last

	b = poll(t, e.m, sub, last, 0) // acknowledge the reset
	for i := range MaxInvalidationQueue + 1 {
		e.put(c, fmt.Sprint("o", i), 64, ReplicateConfig{})
	}
	for i := range MaxInvalidationQueue + 1 {
		require.NoError(t, e.m.remove(fmt.Sprint("o", i), true))
	}
	b = poll(t, e.m, sub, last, 0)
	require.True(t, b.Reset, "an overflowed queue is a reset")
	assert.EqualValues(t, last+MaxInvalidationQueue+1, b.Last)
	b = poll(t, e.m, sub, b.Last, 0) // acknowledged: a heartbeat
	assert.False(t, b.Reset)
	assert.Empty(t, b.Items)

}

// TestInvalidationSubscribers: their count is bounded, and silent ones
// are dropped.
func TestInvalidationSubscribers(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.InvalidationTTL = 20 * time.Millisecond; c.MaxSubscribers = 2 })
	subscribe(t, e.m)
	subscribe(t, e.m)
	_, err := e.m.WaitInvalidations(context.Background(), InvalidationPoll{})
	require.ErrorIs(t, err, errcode.ErrNoAvailableHandle)
	// Silent for 10 TTLs: dropped when room is needed.
	require.Eventually(t, func() bool {
		_, err := e.m.WaitInvalidations(context.Background(), InvalidationPoll{})
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
}

// TestInvalidationPollHolds: an empty poll is held until an item is
// queued, and ends with its context.
func TestInvalidationPollHolds(t *testing.T) {
	e, _, sub := subscribedKey(t, time.Hour)
	got := make(chan InvalidationBatch, 1)
	go func() {
		b, _ := e.m.WaitInvalidations(context.Background(), InvalidationPoll{Sub: sub, Wait: time.Hour})
		got <- b
	}()
	require.NoError(t, e.m.remove("k", true))
	b := <-got
	require.Len(t, b.Items, 1)
	assert.Equal(t, "k", b.Items[0].Key)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		b, _ := e.m.WaitInvalidations(ctx, InvalidationPoll{Sub: sub, Ack: b.Last, Wait: time.Hour})
		got <- b
	}()
	cancel()
	b = <-got
	assert.Empty(t, b.Items)
	assert.False(t, b.Reset)
}

// A master that starts with state (restored from its log, promoted from a
// standby) holds removes for InvalidationTTL: the hot caches of the
// master before it never subscribed here and may still serve the value.
// A fresh master holds nothing.
func TestInvalidationHoldAfterRestore(t *testing.T) {
	const ttl = 200 * time.Millisecond
	e := newEnv(t, func(c *Config) { c.InvalidationTTL = ttl })
	c := cl(1)
	e.mount(c, "a", 1<<20)
	e.put(c, "k", 100, ReplicateConfig{})
	started := time.Now()
	require.NoError(t, e.m.Start())
	require.NoError(t, e.m.Remove("k", true))
	assert.GreaterOrEqual(t, time.Since(started), ttl, "a remove answered before the previous master's caches lapsed")

	fresh := newEnv(t, func(c *Config) { c.InvalidationTTL = ttl })
	require.NoError(t, fresh.m.Start())
	assert.Zero(t, fresh.m.inval.hold.Load(), "a master with nothing to invalidate holds nothing")
}

// TestInvalidationOfDroppedReplica: an object that loses one of its two
// replicas with a segment stays readable but is invalidated, since a
// location cache may name the replica whose memory left the pool.
func TestInvalidationOfDroppedReplica(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.InvalidationTTL = 50 * time.Millisecond })
	a, b := cl(1), cl(2)
	e.mount(a, "a", 1<<20)
	segB := e.mount(b, "b", 1<<20)
	sub := subscribe(t, e.m)
	require.Len(t, e.put(a, "two", 100, ReplicateConfig{Replicas: 2}), 2)
	e.put(a, "one", 100, ReplicateConfig{Preferred: []string{"a"}})
	require.NoError(t, e.m.UnmountSegment(b, segB.ID))
	reps, _, err := e.m.GetReplicaList("two")
	require.NoError(t, err)
	assert.Len(t, reps, 1, "the replica on a survives")
	batch := poll(t, e.m, sub, 0, 0)
	require.False(t, batch.Reset)
	var got []string
	for _, it := range batch.Items {
		got = append(got, it.Key)
	}
	assert.Equal(t, []string{"two"}, got, "only the object that lost a replica")
}
