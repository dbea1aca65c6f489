package master

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// TestConcurrent runs writers, readers and removers on overlapping keys
// while the eviction and liveness loops run, the clock moves, and one
// client keeps dying and remounting; then checks the invariants and that
// the op log replays to the same state.
func TestConcurrent(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Shards = 16
		c.EvictInterval = time.Millisecond
		c.LivenessInterval = 2 * time.Millisecond
	})
	steady, flaky := cl(1), cl(2)
	e.mount(steady, "steady", 4<<20)
	e.mount(steady, "steady", 4<<20)
	fs := e.mount(flaky, "flaky", 4<<20)
	if err := e.m.Start(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	var remounts atomic.Int64
	bg.Add(1)
	go func() { // the clock, heartbeats, and the flaky client's life
		defer bg.Done()
		alive := true
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
			e.clk.Advance(500 * time.Millisecond)
			e.m.Ping(steady)
			if i%40 == 0 {
				alive = !alive // 20s of silence: the flaky client expires
			}
			if !alive {
				continue
			}
			if _, st := e.m.Ping(flaky); st == ClientNeedRemount {
				fs.ID.Lo += 1000
				if err := e.m.ReMountSegment(flaky, []alloc.Segment{fs}); err != nil {
					t.Error(err)
					return
				}
				remounts.Add(1)
			}
		}
	}()
	var wg sync.WaitGroup
	var puts, gets atomic.Int64
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			c := []UUID{steady, flaky, cl(3)}[w%3]
			// Run until the flaky client has died and come back twice (the
			// liveness loop expires it), with a cap so a bug cannot hang us.
			deadline := time.Now().Add(60 * time.Second)
			for i := 0; i < 3000 || remounts.Load() < 2 && time.Now().Before(deadline); i++ {
				k := fmt.Sprintf("key-%03d", r.IntN(400))
				switch n := r.IntN(20); {
				case n < 8:
					_, err := e.m.PutStart(c, k, uint64(1+r.IntN(64<<10)), ReplicateConfig{Replicas: 1 + r.IntN(2), SoftPin: r.IntN(10) == 0})
					if err != nil {
						if !errors.Is(err, errcode.ErrObjectAlreadyExists) && !errors.Is(err, errcode.ErrNoAvailableHandle) {
							t.Errorf("PutStart: %v", err)
							return
						}
						continue
					}
					if r.IntN(10) == 0 {
						e.m.PutRevoke(c, k, Memory)
					} else if err := e.m.PutEnd(c, k, Memory, nil); err == nil {
						puts.Add(1)
					} else if !errors.Is(err, errcode.ErrObjectNotFound) { // lost with a segment, or removed by force
						t.Errorf("PutEnd: %v", err)
						return
					}
				case n < 14:
					if _, _, err := e.m.GetReplicaList(k); err == nil {
						gets.Add(1)
					}
				case n < 15:
					e.m.ExistKey(k, r.IntN(2) == 0)
				case n < 18:
					e.m.Remove(k, r.IntN(4) == 0)
				case n < 19:
					keys := []string{k, fmt.Sprintf("key-%03d", r.IntN(400))}
					res, _ := e.m.BatchPutStart(c, keys, []uint64{100, 200}, ReplicateConfig{})
					var ok []string
					for i, x := range res {
						if x.Err == nil {
							ok = append(ok, keys[i])
						}
					}
					e.m.BatchPutEnd(c, ok, Memory, nil)
				default:
					switch r.IntN(20) {
					case 0:
						e.m.RemoveAll(false)
					case 1:
						e.m.RemoveByRegex(fmt.Sprintf("key-%d.*", r.IntN(4)), false)
					default:
						e.m.Evict()
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, e.m)
	st := e.m.Stats()
	t.Logf("puts %d gets %d remounts %d; %+v", puts.Load(), gets.Load(), remounts.Load(), st)
	if puts.Load() == 0 || gets.Load() == 0 || st.EvictedKeys == 0 || st.ExpiredClients < 2 || remounts.Load() < 2 {
		t.Fatalf("the run did not exercise the master: puts %d gets %d stats %+v", puts.Load(), gets.Load(), st)
	}
	// The log taken under all that concurrency is a valid serialisation.
	standby, err := New(Config{Shards: 5, Clock: e.clk})
	if err != nil {
		t.Fatal(err)
	}
	for i, op := range e.log.all() {
		if err := standby.Replay(op); err != nil {
			t.Fatalf("op %d (%v %q): %v", i, op.Kind, op.Key, err)
		}
	}
	if d := diffState(dumpState(e.m), dumpState(standby)); d != "" {
		t.Fatalf("replayed state differs:\n%s", d)
	}
}
