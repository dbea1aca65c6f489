package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStagerWaiterWakes: a free with no one waiting allocates nothing (it
// made a channel per staged piece), and a waiter blocked on a full pool
// still wakes on the next free.
func TestStagerWaiterWakes(t *testing.T) {
	s, err := newStager(1<<20, false)
	require.NoError(t, err)
	t.Cleanup(func() { s.pool.Close() })

	// No waiter: take and give back without allocating.
	allocs := testing.AllocsPerRun(100, func() {
		b := s.tryAlloc(s.chunk)
		if b == nil {
			panic("staging pool empty")
		}
		s.free(b)
	})
	require.Zero(t, allocs)

	// A waiter on a full pool asks for a signal (the channel exists only
	// then) and wakes with the room of the next free.
	held := fillStager(s)
	require.NotEmpty(t, held)
	got := make(chan []byte)
	go func() {
		b, _ := s.alloc(context.Background(), s.chunk)
		got <- b
	}()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.freed != nil
	}, 10*time.Second, time.Millisecond, "the waiter never asked for a signal")
	s.free(held[0])
	b := <-got
	require.Len(t, b, s.chunk, "waiter did not get the freed room")
	s.free(b)
	for _, h := range held[1:] {
		s.free(h)
	}
}

// fillStager takes staging chunks until the pool has no room left.
func fillStager(s *stager) [][]byte {
	var held [][]byte
	for {
		b := s.tryAlloc(s.chunk)
		if b == nil {
			return held
		}
		held = append(held, b)
	}
}
