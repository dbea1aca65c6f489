package event

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/crescent-kv/crescent/event/internal/zmtp"
)

// Generous: the machine may be loaded; nothing here waits this long when
// things work.
const testTimeout = 30 * time.Second

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

type transport struct {
	name     string
	endpoint func(t *testing.T) string
}

var transports = []transport{
	{"tcp", func(*testing.T) string { return "tcp://127.0.0.1:0" }},
	{"ipc", func(t *testing.T) string { return "ipc://" + filepath.Join(t.TempDir(), "pub.sock") }},
}

func replayEndpoint(t *testing.T, tr transport) string {
	if tr.name == "ipc" {
		return "ipc://" + filepath.Join(t.TempDir(), "replay.sock")
	}
	return "tcp://127.0.0.1:0"
}

func newPub(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	if cfg.Mode == ModeAuto {
		cfg.Mode = ModeBind
	}
	p, err := NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// collector gathers deliveries, gaps and restarts.
type collect struct {
	mu       sync.Mutex
	got      []Delivery
	gaps     []Gap
	restarts []Restart
	errs     []error
	events   int
	changed  chan struct{}
}

func newCollect() *collect { return &collect{changed: make(chan struct{}, 1)} }

func (c *collect) config(srcs ...Source) SubscriberConfig {
	return SubscriberConfig{
		Sources: srcs,
		OnBatch: func(d Delivery) {
			c.mu.Lock()
			c.got = append(c.got, d)
			c.events += len(d.Batch.Events)
			c.mu.Unlock()
			c.poke()
		},
		OnGap: func(g Gap) {
			c.mu.Lock()
			c.gaps = append(c.gaps, g)
			c.mu.Unlock()
			c.poke()
		},
		OnRestart: func(r Restart) {
			c.mu.Lock()
			c.restarts = append(c.restarts, r)
			c.mu.Unlock()
			c.poke()
		},
		OnError: func(_ string, err error) {
			c.mu.Lock()
			c.errs = append(c.errs, err)
			c.mu.Unlock()
		},
	}
}

func (c *collect) poke() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// waitFor blocks until cond holds (checked under the lock after every
// callback) or the test context ends.
func (c *collect) waitFor(t *testing.T, ctx context.Context, what string, cond func(*collect) bool) {
	t.Helper()
	for {
		c.mu.Lock()
		ok := cond(c)
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c.changed:
		case <-ctx.Done():
			c.mu.Lock()
			defer c.mu.Unlock()
			t.Fatalf("timed out waiting for %s: %d batches, %d events, gaps %v, errors %v",
				what, len(c.got), c.events, c.gaps, c.errs)
		}
	}
}

func subscribe(t *testing.T, cfg SubscriberConfig) *Subscriber {
	t.Helper()
	s, err := Subscribe(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func storedN(i int) *BlockStored {
	return &BlockStored{BlockHashes: hashes(uint64(i)), TokenIDs: []uint32{uint32(i)}, BlockSize: 16, Medium: "CPU"}
}

// eventIDs flattens the hashes of delivered BlockStored events.
func eventIDs(ds []Delivery) []uint64 {
	var out []uint64
	for _, d := range ds {
		for _, ev := range d.Batch.Events {
			out = append(out, ev.(*BlockStored).BlockHashes[0].Value)
		}
	}
	return out
}

func checkSeqs(t *testing.T, ds []Delivery, from uint64) {
	t.Helper()
	for i, d := range ds {
		if d.Seq != from+uint64(i) {
			t.Fatalf("delivery %d has seq %d, want %d", i, d.Seq, from+uint64(i))
		}
	}
}

func TestPublishSubscribe(t *testing.T) {
	for _, tr := range transports {
		for _, enc := range []Encoding{EncodingMap, EncodingArray} {
			t.Run(tr.name+"/"+enc.String(), func(t *testing.T) {
				ctx := testCtx(t)
				p := newPub(t, PublisherConfig{Endpoint: tr.endpoint(t), ReplayEndpoint: replayEndpoint(t, tr),
					Topic: "kv@pod-1@model", Encoding: enc, DataParallelRank: Ptr(2), MaxBatchEvents: 7})
				c := newCollect()
				subscribe(t, c.config(Source{ID: "pod-1", Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(),
					Topic: "kv@", StartSeq: Ptr(uint64(0))}))
				const n = 500
				for i := range n {
					if err := p.Publish(storedN(i)); err != nil {
						t.Fatal(err)
					}
				}
				c.waitFor(t, ctx, "all events", func(c *collect) bool { return c.events == n })
				c.mu.Lock()
				defer c.mu.Unlock()
				checkSeqs(t, c.got, 0)
				for i, id := range eventIDs(c.got) {
					if id != uint64(i) {
						t.Fatalf("event %d is %d", i, id)
					}
				}
				for _, d := range c.got {
					if d.Publisher != "pod-1" || d.Topic != "kv@pod-1@model" || *d.Batch.DataParallelRank != 2 ||
						len(d.Batch.Events) > 7 {
						t.Fatalf("bad delivery %+v", d)
					}
				}
				if len(c.gaps) != 0 {
					t.Fatalf("gaps: %v", c.gaps)
				}
			})
		}
	}
}

func TestReplayFromSeq(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			ctx := testCtx(t)
			stall := make(chan struct{})
			p := newPub(t, PublisherConfig{Endpoint: tr.endpoint(t), ReplayEndpoint: replayEndpoint(t, tr),
				Topic: "t", MaxBatchEvents: 1, ReplayBuffer: 15,
				hooks: &testHooks{beforeSend: func(seq uint64) {
					if seq == 19 {
						close(stall)
					}
				}}})
			for i := range 20 {
				if err := p.Publish(storedN(i)); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-stall:
			case <-ctx.Done():
				t.Fatal("sender did not reach seq 19")
			}
			replay := func(start uint64) (seqs []uint64) {
				err := Replay(ctx, p.ReplayEndpoint(), start, func(topic []byte, seq uint64, payload []byte) error {
					if string(topic) != "t" {
						return fmt.Errorf("topic %q", topic)
					}
					b, err := DecodeBatch(payload)
					if err != nil {
						return err
					}
					if got := b.Events[0].(*BlockStored).BlockHashes[0].Value; got != seq {
						return fmt.Errorf("seq %d carries event %d", seq, got)
					}
					seqs = append(seqs, seq)
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				return seqs
			}
			// The sender adds seq 19 to the ring just after the hook.
			for {
				if _, newest, ok := p.ring.bounds(); ok && newest == 19 {
					break
				}
				select {
				case <-ctx.Done():
					t.Fatal("seq 19 never buffered")
				case <-time.After(time.Millisecond):
				}
			}
			if got := replay(12); fmt.Sprint(got) != "[12 13 14 15 16 17 18 19]" {
				t.Errorf("replay(12) = %v", got)
			}
			if got := replay(0); len(got) != 15 || got[0] != 5 {
				t.Errorf("replay(0) with a ring of 15 = %v", got)
			}
			if got := replay(20); len(got) != 0 {
				t.Errorf("replay(20) = %v", got)
			}
			if st := p.Stats(); st.ReplayRequests != 3 {
				t.Errorf("ReplayRequests = %d", st.ReplayRequests)
			}
		})
	}
}

func TestGapFilledFromReplay(t *testing.T) {
	ctx := testCtx(t)
	lost := map[uint64]bool{3: true, 4: true, 5: true, 9: true}
	p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		MaxBatchEvents: 1, hooks: &testHooks{dropLive: func(seq uint64) bool { return lost[seq] }}})
	c := newCollect()
	s := subscribe(t, c.config(Source{ID: "a", Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}))
	if err := p.WaitSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		if err := p.Publish(storedN(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor(t, ctx, "12 batches", func(c *collect) bool { return len(c.got) == 12 })
	c.mu.Lock()
	defer c.mu.Unlock()
	checkSeqs(t, c.got, 0)
	for _, d := range c.got {
		if d.Replayed != lost[d.Seq] {
			t.Errorf("seq %d: Replayed = %v", d.Seq, d.Replayed)
		}
	}
	if len(c.gaps) != 0 {
		t.Errorf("gaps %v", c.gaps)
	}
	if st := s.Stats()[0]; st.Delivered != 12 || st.Replayed != 4 || st.Gaps != 0 || st.NextSeq != 12 {
		t.Errorf("stats %+v", st)
	}
}

func TestGapWithoutReplayIsReported(t *testing.T) {
	ctx := testCtx(t)
	p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", MaxBatchEvents: 1,
		hooks: &testHooks{dropLive: func(seq uint64) bool { return seq == 2 || seq == 3 }}})
	c := newCollect()
	subscribe(t, c.config(Source{Endpoint: p.Endpoint()}))
	if err := p.WaitSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if err := p.Publish(storedN(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor(t, ctx, "4 batches", func(c *collect) bool { return len(c.got) == 4 })
	c.mu.Lock()
	defer c.mu.Unlock()
	if fmt.Sprint(c.gaps) != fmt.Sprintf("[{%s 2 3}]", p.Endpoint()) {
		t.Errorf("gaps %v", c.gaps)
	}
}

func TestDropOldestAccounting(t *testing.T) {
	ctx := testCtx(t)
	entered, release := make(chan struct{}), make(chan struct{})
	p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		QueueSize: 8, Overflow: DropOldest, MaxBatchEvents: 8,
		hooks: &testHooks{beforeSend: func(seq uint64) {
			if seq == 0 {
				close(entered)
				<-release
			}
		}}})
	c := newCollect()
	subscribe(t, c.config(Source{ID: "a", Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint()}))
	if err := p.WaitSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(storedN(100)); err != nil {
		t.Fatal(err)
	}
	<-entered // the sender holds seq 0; the queue is empty and stalled
	done := make(chan error)
	go func() {
		var err error
		for i := range 20 {
			if err = p.Publish(storedN(i)); err != nil {
				break
			}
		}
		done <- err
	}()
	select {
	case err := <-done: // DropOldest never waits
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("Publish blocked under DropOldest")
	}
	if st := p.Stats(); st.DroppedEvents != 12 || st.QueueDepth != 8 {
		t.Fatalf("stats before release %+v", st)
	}
	close(release)
	c.waitFor(t, ctx, "the surviving events", func(c *collect) bool { return c.events == 9 })
	c.mu.Lock()
	defer c.mu.Unlock()
	if fmt.Sprint(eventIDs(c.got)) != "[100 12 13 14 15 16 17 18 19]" {
		t.Errorf("events %v", eventIDs(c.got))
	}
	// Seq 1 belonged to the dropped events: never sent, not replayable.
	if len(c.got) != 2 || c.got[0].Seq != 0 || c.got[1].Seq != 2 {
		t.Errorf("deliveries %+v", c.got)
	}
	if fmt.Sprint(c.gaps) != "[{a 1 1}]" {
		t.Errorf("gaps %v", c.gaps)
	}
	if st := p.Stats(); st.SkippedSeqs != 1 || st.PublishedBatches != 2 || st.PublishedEvents != 9 || st.NextSeq != 3 {
		t.Errorf("stats %+v", st)
	}
}

func TestBlockPolicyWaitsForRoom(t *testing.T) {
	ctx := testCtx(t)
	entered, release := make(chan struct{}), make(chan struct{})
	p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", QueueSize: 4,
		hooks: &testHooks{beforeSend: func(seq uint64) {
			if seq == 0 {
				close(entered)
				<-release
			}
		}}})
	if err := p.Publish(storedN(0)); err != nil {
		t.Fatal(err)
	}
	<-entered
	for i := range 4 {
		if err := p.Publish(storedN(i)); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	err := p.PublishContext(short, storedN(5))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("PublishContext on a full queue = %v, want DeadlineExceeded", err)
	}
	close(release)
	if err := p.PublishContext(ctx, storedN(5)); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.DroppedEvents != 0 {
		t.Fatalf("Block dropped %d", st.DroppedEvents)
	}
}

func TestConcurrentProducers(t *testing.T) {
	ctx := testCtx(t)
	p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", QueueSize: 64, MaxBatchEvents: 16,
		SendHWM: 16, NoDrop: true})
	c := newCollect()
	subscribe(t, c.config(Source{Endpoint: p.Endpoint()}))
	if err := p.WaitSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	const producers, each = 8, 2000
	var wg sync.WaitGroup
	for w := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ev := &BlockRemoved{BlockHashes: hashes(uint64(w)<<32 | uint64(i))}
				if err := p.Publish(ev); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	c.waitFor(t, ctx, "all events", func(c *collect) bool { return c.events == producers*each })
	c.mu.Lock()
	defer c.mu.Unlock()
	checkSeqs(t, c.got, c.got[0].Seq)
	next := make([]uint64, producers)
	for _, d := range c.got {
		for _, ev := range d.Batch.Events {
			h := ev.(*BlockRemoved).BlockHashes[0].Value
			w, i := h>>32, h&0xffffffff
			if i != next[w] {
				t.Fatalf("producer %d: event %d after %d", w, i, next[w])
			}
			next[w]++
		}
	}
	if st := p.Stats(); st.SubscriberDrops != 0 || st.DroppedEvents != 0 {
		t.Fatalf("drops with Block+NoDrop: %+v", st)
	}
}

func TestCloseDrains(t *testing.T) {
	ctx := testCtx(t)
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: ModeBind, SendHWM: -1})
	if err != nil {
		t.Fatal(err)
	}
	c := newCollect()
	subscribe(t, c.config(Source{Endpoint: p.Endpoint()}))
	if err := p.WaitSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	for i := range n {
		if err := p.Publish(storedN(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(storedN(0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Publish after Close = %v", err)
	}
	c.waitFor(t, ctx, "every event published before Close", func(c *collect) bool { return c.events == n })
}

func TestCloseTimeoutCountsLoss(t *testing.T) {
	release := make(chan struct{})
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: ModeBind, MaxBatchEvents: 1,
		hooks: &testHooks{beforeSend: func(seq uint64) {
			if seq == 0 {
				<-release
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := p.Publish(storedN(i)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	go func() {
		<-ctx.Done()
		close(release)
	}()
	err = p.Close(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want DeadlineExceeded", err)
	}
	t.Log(err)
}

func TestMultiplePublishers(t *testing.T) {
	ctx := testCtx(t)
	c := newCollect()
	var srcs []Source
	var pubs []*Publisher
	for i := range 3 {
		p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
			Topic: fmt.Sprintf("kv@pod-%d@m", i)})
		pubs = append(pubs, p)
		srcs = append(srcs, Source{ID: fmt.Sprint(i), Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(),
			StartSeq: Ptr(uint64(0))})
	}
	subscribe(t, c.config(srcs...))
	for i, p := range pubs {
		for j := range 10 * (i + 1) {
			if err := p.Publish(storedN(j)); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.waitFor(t, ctx, "60 events", func(c *collect) bool { return c.events == 60 })
	c.mu.Lock()
	defer c.mu.Unlock()
	per := map[string][]Delivery{}
	for _, d := range c.got {
		per[d.Publisher] = append(per[d.Publisher], d)
	}
	for i := range 3 {
		ds := per[fmt.Sprint(i)]
		checkSeqs(t, ds, 0)
		if ids := eventIDs(ds); len(ids) != 10*(i+1) || ds[0].Topic != fmt.Sprintf("kv@pod-%d@m", i) {
			t.Errorf("publisher %d: %v", i, ids)
		}
	}
}

func TestPublisherRestartDetected(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	ep, rep := "ipc://"+filepath.Join(dir, "p.sock"), "ipc://"+filepath.Join(dir, "r.sock")
	p1, err := NewPublisher(PublisherConfig{Endpoint: ep, ReplayEndpoint: rep, MaxBatchEvents: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := newCollect()
	subscribe(t, c.config(Source{ID: "a", Endpoint: ep, ReplayEndpoint: rep, StartSeq: Ptr(uint64(0))}))
	for i := range 5 {
		if err := p1.Publish(storedN(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor(t, ctx, "first incarnation", func(c *collect) bool { return c.events == 5 })
	if err := p1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	p2 := newPub(t, PublisherConfig{Endpoint: ep, ReplayEndpoint: rep, MaxBatchEvents: 1})
	if err := p2.WaitSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := p2.Publish(storedN(100 + i)); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor(t, ctx, "second incarnation", func(c *collect) bool { return c.events == 7 })
	c.mu.Lock()
	defer c.mu.Unlock()
	if fmt.Sprint(c.restarts) != "[{a 4 0}]" && fmt.Sprint(c.restarts) != "[{a 4 1}]" {
		t.Errorf("restarts %v", c.restarts)
	}
	if ids := eventIDs(c.got); fmt.Sprint(ids) != "[0 1 2 3 4 100 101]" {
		t.Errorf("events %v", ids)
	}
	if len(c.gaps) != 0 {
		t.Errorf("gaps %v", c.gaps)
	}
}

// TestZmq4Interop talks to our sockets with go-zeromq/zmq4's own SUB,
// DEALER and (for connect mode) a bound SUB: an independent ZMTP stack.
func TestZmq4Interop(t *testing.T) {
	ctx := testCtx(t)
	t.Run("bound PUB, zmq4 SUB and DEALER", func(t *testing.T) {
		p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
			Topic: "kv@x@y", Encoding: EncodingArray})
		sub := zmq4.NewSub(ctx)
		defer sub.Close()
		if err := sub.Dial(p.Endpoint()); err != nil {
			t.Fatal(err)
		}
		if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
			t.Fatal(err)
		}
		if err := p.WaitSubscribers(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := p.Publish(&AllBlocksCleared{}); err != nil {
			t.Fatal(err)
		}
		msg, err := sub.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != 3 || string(msg.Frames[0]) != "kv@x@y" || binary.BigEndian.Uint64(msg.Frames[1]) != 0 {
			t.Fatalf("live message %q", msg.Frames)
		}
		if b, err := DecodeBatch(msg.Frames[2]); err != nil || b.Events[0].Kind() != KindAllBlocksCleared {
			t.Fatalf("payload %x: %v", msg.Frames[2], err)
		}

		dealer := zmq4.NewDealer(ctx)
		defer dealer.Close()
		if err := dealer.Dial(p.ReplayEndpoint()); err != nil {
			t.Fatal(err)
		}
		if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, make([]byte, 8))); err != nil {
			t.Fatal(err)
		}
		reply, err := dealer.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(reply.Frames) != 4 || len(reply.Frames[0]) != 0 || string(reply.Frames[1]) != "kv@x@y" ||
			string(reply.Frames[3]) != string(msg.Frames[2]) {
			t.Fatalf("replay reply %q", reply.Frames)
		}
		end, err := dealer.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(end.Frames) != 4 || len(end.Frames[1]) != 0 || binary.BigEndian.Uint64(end.Frames[2]) != EndSeq ||
			len(end.Frames[3]) != 0 {
			t.Fatalf("end marker %q", end.Frames)
		}
		// A malformed start gets the end marker alone, not silence.
		if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, []byte{1, 2, 3})); err != nil {
			t.Fatal(err)
		}
		if end, err = dealer.Recv(); err != nil || binary.BigEndian.Uint64(end.Frames[2]) != EndSeq {
			t.Fatalf("reply to a malformed request %q: %v", end.Frames, err)
		}
	})
	t.Run("connect mode to a bound zmq4 SUB", func(t *testing.T) {
		sub := zmq4.NewSub(ctx)
		defer sub.Close()
		if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
			t.Fatal(err)
		}
		// Mode Auto: no wildcard in the endpoint, so the PUB connects.
		p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://" + sub.Addr().String()})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close(ctx)
		if err := p.WaitSubscribers(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := p.Publish(&BlockRemoved{BlockHashes: hashes(5)}); err != nil {
			t.Fatal(err)
		}
		msg, err := sub.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 {
			t.Fatalf("message %q", msg.Frames)
		}
	})
}

func TestEndpoints(t *testing.T) {
	for ep, bind := range map[string]bool{
		"tcp://*:5557": true, "tcp://[::]:5557": true, "ipc:///tmp/x": true, "inproc://x": true,
		"tcp://127.0.0.1:5557": false, "tcp://indexer:5557": false,
	} {
		if zmtp.ShouldBind(ep) != bind {
			t.Errorf("ShouldBind(%q) != %v", ep, bind)
		}
	}
	for _, ep := range []string{"tcp://", "tcp://nohost", "inproc://x", "udp://1.2.3.4:5", "foo"} {
		if _, err := NewPublisher(PublisherConfig{Endpoint: ep, Mode: ModeBind}); !errors.Is(err, ErrEndpoint) {
			t.Errorf("NewPublisher(%q) = %v, want ErrEndpoint", ep, err)
		}
	}
	if _, err := Subscribe(SubscriberConfig{Sources: []Source{{Endpoint: "inproc://x"}}, OnBatch: func(Delivery) {}}); !errors.Is(err, ErrEndpoint) {
		t.Errorf("Subscribe(inproc) = %v", err)
	}
	if _, err := Subscribe(SubscriberConfig{Sources: []Source{{Endpoint: "tcp://127.0.0.1:1"}}}); !errors.Is(err, ErrConfig) {
		t.Errorf("Subscribe without OnBatch = %v", err)
	}
	if _, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: ModeBind, QueueSize: -1}); !errors.Is(err, ErrConfig) {
		t.Errorf("negative queue = %v", err)
	}
	p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	for _, ep := range []string{p.Endpoint(), p.ReplayEndpoint()} {
		if e, err := zmtp.Parse(ep); err != nil || e.Addr == "127.0.0.1:0" {
			t.Errorf("bound endpoint %q does not name the chosen port", ep)
		}
	}
	// A replay port already taken fails cleanly (goleak checks the rest).
	if _, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: ModeBind,
		ReplayEndpoint: p.ReplayEndpoint()}); !errors.Is(err, ErrEndpoint) {
		t.Errorf("replay port in use = %v", err)
	}
	if _, err := NewPublisher(PublisherConfig{Endpoint: p.Endpoint(), Mode: ModeBind}); !errors.Is(err, ErrEndpoint) {
		t.Errorf("PUB port in use = %v", err)
	}
	if err := p.Publish(nil); !errors.Is(err, ErrUnencodable) {
		t.Errorf("Publish(nil) = %v", err)
	}
	if err := p.Publish(&BlockStored{ExtraKeys: [][]any{{make(chan int)}}}); !errors.Is(err, ErrUnencodable) {
		t.Errorf("Publish(bad extra key) = %v", err)
	}
}

func TestCollector(t *testing.T) {
	ctx := testCtx(t)
	p := newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", QueueSize: 10, MaxBatchEvents: 2})
	c := newCollect()
	subscribe(t, c.config(Source{Endpoint: p.Endpoint()}))
	if err := p.WaitSubscribers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if err := p.Publish(storedN(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor(t, ctx, "4 events", func(c *collect) bool { return c.events == 4 })
	// The publisher counts a batch after handing it to the socket, so a
	// subscriber can see it first.
	for p.Stats().PublishedEvents != 4 {
		if ctx.Err() != nil {
			t.Fatalf("published events %d, want 4", p.Stats().PublishedEvents)
		}
		time.Sleep(time.Millisecond)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(p.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		if mf.GetMetric()[0].GetCounter() != nil {
			got[mf.GetName()] = m.GetCounter().GetValue()
		} else {
			got[mf.GetName()] = m.GetGauge().GetValue()
		}
	}
	st := p.Stats()
	want := map[string]float64{
		"crescent_kv_events_published_events_total":  4,
		"crescent_kv_events_published_batches_total": float64(st.PublishedBatches),
		"crescent_kv_events_queue_capacity":          10,
		"crescent_kv_events_queue_depth":             0,
		"crescent_kv_events_subscribers":             1,
		"crescent_kv_events_dropped_events_total":    0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if len(got) != 9 {
		t.Errorf("%d metrics: %v", len(got), got)
	}
}

func TestQueueIsolatesBlockUpdate(t *testing.T) {
	q := newQueue(16, Block)
	evs := []Event{storedN(1), &BlockUpdate{}, &BlockUpdate{}, &BlockRemoved{}, &AllBlocksCleared{}, &BlockUpdate{}}
	if _, err := q.push(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var got []string
	for range 4 {
		out, _, ok := q.pop(nil, 64, 0, timer)
		if !ok {
			t.Fatal("queue closed")
		}
		var kinds []string
		for _, e := range out {
			kinds = append(kinds, e.Kind().String())
		}
		got = append(got, fmt.Sprint(kinds))
	}
	want := "[[BlockStored] [BlockUpdate BlockUpdate] [BlockRemoved AllBlocksCleared] [BlockUpdate]]"
	if fmt.Sprint(got) != want {
		t.Fatalf("batches %v, want %v", got, want)
	}
}

// TestStatsCountBatchBeforeSend: by the time a batch can reach a
// subscriber, Stats counts it (the drop-oldest test read Stats right after
// its subscriber had the last batch, and saw it uncounted when the sender
// had not yet updated its counters).
func TestStatsCountBatchBeforeSend(t *testing.T) {
	ctx := testCtx(t)
	var p *Publisher
	seen := make(chan Stats, 4)
	p = newPub(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", MaxBatchEvents: 1,
		hooks: &testHooks{dropLive: func(seq uint64) bool {
			seen <- p.Stats() // right before the send
			return false
		}}})
	for i := range 3 {
		if err := p.Publish(storedN(i)); err != nil {
			t.Fatal(err)
		}
		select {
		case st := <-seen:
			if st.PublishedBatches != uint64(i+1) || st.PublishedEvents != uint64(i+1) || st.NextSeq != uint64(i+1) {
				t.Fatalf("batch %d about to be sent, stats %+v", i, st)
			}
		case <-ctx.Done():
			t.Fatal("batch not sent")
		}
	}
}
