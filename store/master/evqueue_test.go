package master

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gateSink records events; once armed, its first Emit says so on entered
// and every Emit waits for release: a publisher under the Block policy
// with a subscriber that stopped reading.
type gateSink struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	evs     []*Event
}

func newGateSink() *gateSink {
	return &gateSink{entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gateSink) Emit(e *Event) {
	if g.armed.Load() {
		g.once.Do(func() { close(g.entered) })
		<-g.release
	}
	g.mu.Lock()
	g.evs = append(g.evs, e)
	g.mu.Unlock()
}

func (g *gateSink) events() []*Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Event(nil), g.evs...)
}

// within fails the test when fn does not return: a deadlock detector, not
// a speed assertion.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not complete while the event sink was blocked", what)
	}
}

// TestBlockedSinkDoesNotStallShards: while a removal or eviction of many
// keys waits on a blocked event sink, Gets and Puts on the same shard (one
// shard here) still complete.
func TestBlockedSinkDoesNotStallShards(t *testing.T) {
	const n = 2000
	for _, tc := range []struct {
		name string
		run  func(m *Master) int
	}{
		{"RemoveByRegex", func(m *Master) int { r, _ := m.RemoveByRegex(`rm/.*`, false); return int(r) }},
		{"RemoveAll", func(m *Master) int { r, _ := m.RemoveAll(false); return int(r) }},
		{"Evict", func(m *Master) int { return m.Evict().Keys }},
		{"Remove", func(m *Master) int { _ = m.Remove("rm/0", false); return 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := newGateSink()
			e := newEnv(t, func(c *Config) { c.Shards = 1; c.Events = sink })
			a := cl(1)
			e.mount(a, "host:1", 8<<20)
			e.put(a, "keep", 64, ReplicateConfig{HardPin: true})
			_, _, err := e.m.GetReplicaList("keep") // leased: RemoveAll removes key by key
			require.NoError(t, err)
			for i := range n {
				e.put(a, fmt.Sprintf("rm/%d", i), 64, ReplicateConfig{})
			}
			before := len(sink.events())

			sink.armed.Store(true)
			removed := make(chan int, 1)
			go func() { removed <- tc.run(e.m) }()
			<-sink.entered

			within(t, "Get and PutStart on the blocked shard", func() {
				_, _, err := e.m.GetReplicaList("keep")
				assert.NoError(t, err)
				_, err = e.m.PutStart(a, "new", 64, ReplicateConfig{})
				assert.NoError(t, err)
				ok, err := e.m.ExistKey("keep", true)
				assert.NoError(t, err)
				assert.True(t, ok)
			})

			close(sink.release)
			got := <-removed
			require.Positive(t, got)
			evs := sink.events()[before:]
			require.Len(t, evs, got)
			for _, ev := range evs {
				require.Equal(t, EventRemoved, ev.Kind)
			}
			checkInvariants(t, e.m)
		})
	}
}

// TestEventsOfOneKeyInOrder: with events leaving the shard locks before
// the sink, each key's Stored and Removed still alternate.
func TestEventsOfOneKeyInOrder(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Shards = 2 })
	a := cl(1)
	e.mount(a, "host:1", 8<<20)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				k := fmt.Sprintf("k%d", (w*7+i)%5) // writers collide on 5 keys
				if _, gen, err := e.m.PutStartGen(a, k, 64, ReplicateConfig{}); err == nil {
					e.m.PutEndGen(a, k, gen, Memory, nil)
				}
				e.m.Remove(k, true)
			}
		}()
	}
	wg.Wait()
	last := map[string]EventKind{}
	for _, ev := range e.ev.take() {
		prev, seen := last[ev.Key]
		switch ev.Kind {
		case EventStored:
			require.True(t, !seen || prev == EventRemoved, "%q stored twice", ev.Key)
		case EventRemoved:
			require.Equal(t, EventStored, prev, "%q removed before it was stored", ev.Key)
		}
		last[ev.Key] = ev.Kind
	}
}
