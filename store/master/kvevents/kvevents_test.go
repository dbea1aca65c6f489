package kvevents

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/event"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
)

// kvFeed is a real publisher on loopback with a real subscriber (replay
// from seq 0, so nothing is lost to the slow-joiner window).
type kvFeed struct {
	pub *event.Publisher
	mu  sync.Mutex
	got []event.Event
	ch  chan struct{}
}

func newKVFeed(t *testing.T, enc event.Encoding) *kvFeed {
	t.Helper()
	pub, err := event.NewPublisher(event.PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Mode: event.ModeBind,
		Topic: "kv@master", Encoding: enc, Overflow: event.DropOldest, FlushInterval: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	f := &kvFeed{pub: pub, ch: make(chan struct{}, 1)}
	sub, err := event.Subscribe(event.SubscriberConfig{
		Sources: []event.Source{{ID: "master", Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(),
			Topic: "kv@master", StartSeq: event.Ptr(uint64(0))}},
		OnBatch: func(d event.Delivery) {
			f.mu.Lock()
			f.got = append(f.got, d.Batch.Events...)
			f.mu.Unlock()
			select {
			case f.ch <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sub.Close()
		pub.Close(context.Background())
	})
	return f
}

// wait returns the first n events received, failing after a deadline.
func (f *kvFeed) wait(t *testing.T, n int) []event.Event {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		f.mu.Lock()
		if len(f.got) >= n {
			out := append([]event.Event(nil), f.got[:n]...)
			f.got = f.got[n:]
			f.mu.Unlock()
			return out
		}
		f.mu.Unlock()
		select {
		case <-f.ch:
		case <-deadline:
			t.Fatalf("got %d events, want %d", len(f.got), n)
		}
	}
}

func TestKVEventsFromMaster(t *testing.T) {
	for _, enc := range []event.Encoding{event.EncodingMap, event.EncodingArray} {
		t.Run(enc.String(), func(t *testing.T) {
			f := newKVFeed(t, enc)
			sink := New(f.pub)
			e := mastertest.New(t, func(c *master.Config) { c.Events = sink })
			a := mastertest.Client(1)
			e.Mount(a, "a:1", 1<<20)

			// A put that carries the engine's block metadata.
			meta := &master.BlockMeta{BlockHashes: []uint64{0xfeedface, 42}, HasParent: true, ParentHash: 7,
				TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, HasLora: true, LoraID: 3, LoraName: "adapter"}
			if _, err := e.M.PutStart(a, "model/layer0/blk", 4096, master.ReplicateConfig{}); err != nil {
				t.Fatal(err)
			}
			if err := e.M.PutEnd(a, "model/layer0/blk", master.Memory, meta); err != nil {
				t.Fatal(err)
			}
			// Without metadata the key is the hash (reference fallback).
			e.Put(a, "0x00000000000000ff", 4096, master.ReplicateConfig{})
			e.Put(a, "12345", 4096, master.ReplicateConfig{})
			// Neither: no event, counted.
			e.Put(a, "not-a-hash", 4096, master.ReplicateConfig{})
			if err := e.M.Remove("model/layer0/blk", false); err != nil {
				t.Fatal(err)
			}
			if _, err := e.M.RemoveAll(false); err != nil {
				t.Fatal(err)
			}

			evs := f.wait(t, 5)
			st, ok := evs[0].(*event.BlockStored)
			if !ok || len(st.BlockHashes) != 2 || st.BlockHashes[0].Value != 0xfeedface || st.BlockHashes[1].Value != 42 ||
				st.ParentBlockHash == nil || st.ParentBlockHash.Value != 7 || len(st.TokenIDs) != 4 || st.BlockSize != 2 ||
				st.LoraID == nil || *st.LoraID != 3 || st.LoraName != "adapter" || st.Medium != "CPU" {
				t.Fatalf("stored with metadata: %#v", evs[0])
			}
			if st, ok := evs[1].(*event.BlockStored); !ok || len(st.BlockHashes) != 1 || st.BlockHashes[0].Value != 0xff {
				t.Fatalf("hex key: %#v", evs[1])
			}
			if st, ok := evs[2].(*event.BlockStored); !ok || st.BlockHashes[0].Value != 12345 {
				t.Fatalf("decimal key: %#v", evs[2])
			}
			// The removal carries the hashes the put gave, not the key's.
			if rm, ok := evs[3].(*event.BlockRemoved); !ok || len(rm.BlockHashes) != 2 || rm.BlockHashes[0].Value != 0xfeedface {
				t.Fatalf("removed: %#v", evs[3])
			}
			if _, ok := evs[4].(*event.AllBlocksCleared); !ok {
				t.Fatalf("cleared: %#v", evs[4])
			}
			if sink.Unparsed() != 1 || sink.Failed() != 0 {
				t.Fatalf("unparsed %d failed %d", sink.Unparsed(), sink.Failed())
			}
		})
	}
}

// Eviction and the loss of a client's segment announce removals too.
func TestKVEventsEvictionAndLoss(t *testing.T) {
	f := newKVFeed(t, event.EncodingMap)
	e := mastertest.New(t, func(c *master.Config) {
		c.Events = New(f.pub)
		c.EvictionHighWatermark = 0.5
		c.EvictionRatio = 0.5
	})
	a, b := mastertest.Client(1), mastertest.Client(2)
	e.Mount(a, "a:1", 64<<10)
	e.Mount(b, "b:1", 64<<10)
	for _, key := range []string{"1", "2", "3"} {
		e.Put(a, key, 16<<10, master.ReplicateConfig{Preferred: []string{"a:1"}})
	}
	f.wait(t, 3) // stored
	r := e.M.Evict()
	if r.Keys == 0 {
		t.Fatalf("nothing evicted: %+v", r)
	}
	for _, ev := range f.wait(t, r.Keys) {
		if _, ok := ev.(*event.BlockRemoved); !ok {
			t.Fatalf("eviction event: %#v", ev)
		}
	}
	// b's only object goes with b's segment.
	e.Put(b, "99", 4096, master.ReplicateConfig{Preferred: []string{"b:1"}})
	f.wait(t, 1)
	e.Clk.Advance(e.M.Config().ClientTTL + time.Second)
	e.M.Ping(a) // a stays alive
	e.M.Tick()
	for _, ev := range f.wait(t, 1) {
		rm, ok := ev.(*event.BlockRemoved)
		if !ok || rm.BlockHashes[0].Value != 99 {
			t.Fatalf("loss event: %#v", ev)
		}
	}
}

func TestParseKeyHash(t *testing.T) {
	for key, want := range map[string]uint64{"0": 0, "18446744073709551615": 1<<64 - 1, "0xff": 255, "0XFF": 255, "0x0000000000000001": 1} {
		if got, ok := ParseKeyHash(key); !ok || got != want {
			t.Errorf("%q: %d %v", key, got, ok)
		}
	}
	for _, key := range []string{"", "0x", "+1", "-1", "18446744073709551616", "0x1_0", "12a", "model/1", " 1", "0x10000000000000000"} {
		if _, ok := ParseKeyHash(key); ok {
			t.Errorf("%q parsed", key)
		}
	}
}
