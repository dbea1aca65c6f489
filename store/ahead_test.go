package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/storepb"
)

// warmAhead puts values of size until the client holds reservations for
// the class, and returns how many puts that took.
func warmAhead(t *testing.T, c *Client, prefix string, size int, rc ReplicateConfig) int {
	t.Helper()
	ctx := tctx(t)
	n := 0
	eventually(t, "reservations for the class", func() bool {
		if err := c.Put(ctx, fmt.Sprintf("%s/%d", prefix, n), testutil.Bytes(size, uint64(n)), rc); err != nil {
			t.Fatal(err)
		}
		n++
		return c.ahead.held() > 0
	})
	return n
}

// fillAhead puts (and removes again, so the pool does not fill) values
// of size until c holds want reservations of their class (topped up in
// chunks, a class is full only just after a top-up) and returns how many
// it put.
func fillAhead(t *testing.T, c *Client, prefix string, size int, rc ReplicateConfig, want int) int {
	t.Helper()
	ctx := tctx(t)
	n := 0
	eventually(t, "a full class", func() bool {
		if c.ahead.held() == want {
			return true
		}
		key := fmt.Sprintf("%s/%d", prefix, n)
		require.NoError(t, c.Put(ctx, key, testutil.Bytes(size, uint64(n)), rc))
		require.NoError(t, c.Remove(ctx, key, false))
		n++
		return false
	})
	return n
}

// TestPutAhead: once a size is put repeatedly, each put is one CommitPut
// (no PutStart/PutEnd), values land where another client reads them, and
// Close gives every reservation back.
func TestPutAhead(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 32<<20, func(c *Config) { c.PutAhead = 4 })
	b := newTestClient(t, tm, 32<<20)
	ctx := tctx(t)
	rc := ReplicateConfig{Replicas: 2}
	warm := warmAhead(t, a, "warm", 64<<10, rc)
	fillAhead(t, a, "fill", 64<<10, rc, 4)
	if st := tm.m.Stats(); st.Reservations != 4 || st.ReservedBytes != 4*64<<10 {
		t.Fatalf("master holds %d reservations of %d bytes, want 4", st.Reservations, st.ReservedBytes)
	}
	before := a.Stats()
	const n = 20
	for i := range n {
		if err := a.Put(ctx, fmt.Sprintf("k/%d", i), testutil.Bytes(64<<10, uint64(100+i)), rc); err != nil {
			t.Fatal(err)
		}
	}
	after := a.Stats()
	if d := after.PutsAhead - before.PutsAhead; d != n {
		t.Fatalf("%d of %d puts went ahead", d, n)
	}
	rpc := func(s Stats, name string) uint64 { return s.RPC[name].Calls }
	if d := rpc(after, "CommitPut") - rpc(before, "CommitPut"); d != n {
		t.Fatalf("%d CommitPut calls for %d puts", d, n)
	}
	if d := rpc(after, "PutStart") + rpc(after, "PutEnd") - rpc(before, "PutStart") - rpc(before, "PutEnd"); d != 0 {
		t.Fatalf("%d PutStart/PutEnd calls in steady state", d)
	}
	// Topped up once half the class is used: 3 or 4 held.
	if st := tm.m.Stats(); st.Reservations < 3 || st.Reservations > 4 {
		t.Fatalf("reservations not replaced: %d", st.Reservations)
	}
	for i := range n {
		got, err := b.Get(ctx, fmt.Sprintf("k/%d", i))
		if err != nil || !bytes.Equal(got, testutil.Bytes(64<<10, uint64(100+i))) {
			t.Fatalf("get k/%d: %v", i, err)
		}
		if segs := segmentsOf(t, tm, fmt.Sprintf("k/%d", i)); len(segs) != 2 {
			t.Fatalf("k/%d on %v", i, segs)
		}
	}
	// Another size or config is another class: the first put of it takes
	// two RPCs.
	if err := a.Put(ctx, "other", testutil.Bytes(1000, 1), rc); err != nil {
		t.Fatal(err)
	}
	if a.Stats().PutsAhead != after.PutsAhead {
		t.Fatal("a put of a new size went ahead")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if st := tm.m.Stats(); st.Reservations != 0 || st.Keys != int64(warm+n+1) {
		t.Fatalf("after Close: %d reservations, %d keys", st.Reservations, st.Keys)
	}
}

// TestPutAheadDuplicateAndFailure: a put-ahead of a stored key fails with
// OBJECT_ALREADY_EXISTS and keeps its reservation; one whose write fails
// stores nothing and gives its reservation back.
func TestPutAheadDuplicateAndFailure(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 32<<20, protocols("tcp"), func(c *Config) { c.PutAhead = 2 }, noRetries)
	b := newTestClient(t, tm, 32<<20, protocols("tcp"))
	ctx := tctx(t)
	rc := ReplicateConfig{Preferred: []string{b.SegmentName()}}
	warmAhead(t, a, "warm", 4096, rc)
	eventually(t, "a full class", func() bool { return a.ahead.held() == 2 })
	if err := a.Put(ctx, "warm/0", testutil.Bytes(4096, 9), rc); !errors.Is(err, errcode.ErrObjectAlreadyExists) {
		t.Fatalf("duplicate put: %v", err)
	}
	if a.ahead.held() != 2 || a.Stats().AheadGone != 0 {
		t.Fatalf("duplicate lost its reservation: held %d", a.ahead.held())
	}
	if got, err := b.Get(ctx, "warm/0"); err != nil || !bytes.Equal(got, testutil.Bytes(4096, 0)) {
		t.Fatalf("the first value changed: %v", err)
	}

	// The write fails: b's segment cannot be reached by a.
	a.beforeWrite = func() { b.eng.Close() }
	err := a.Put(ctx, "doomed", testutil.Bytes(4096, 1), rc)
	a.beforeWrite = nil
	if !errors.Is(err, errcode.ErrTransferFail) {
		t.Fatalf("put to a dead engine: %v", err)
	}
	if _, err := tm.m.QueryKey("doomed"); !errors.Is(err, errcode.ErrObjectNotFound) {
		t.Fatalf("master knows the failed key: %v", err)
	}
	// Given back with the next RPC, or by the background loop, with the
	// other one on the segment that failed.
	eventually(t, "the reservations given back", func() bool { return tm.m.Stats().Reservations == 0 })
}

// TestPutAheadGone: a reservation the master no longer has sends the put
// down the two-RPC path, which stores it.
func TestPutAheadGone(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 32<<20, func(c *Config) { c.PutAhead = 3 })
	ctx := tctx(t)
	warmAhead(t, a, "warm", 8192, ReplicateConfig{})
	eventually(t, "a full class", func() bool { return tm.m.Stats().Reservations == 3 })
	var ids []uint64
	for _, r := range tm.m.Reservations() {
		ids = append(ids, r.ID)
	}
	if n := tm.m.Unreserve(master.UUID{Hi: a.ID().Hi, Lo: a.ID().Lo}, ids); n != 3 {
		t.Fatalf("freed %d", n)
	}
	if err := a.Put(ctx, "k", testutil.Bytes(8192, 5), ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.AheadGone != 1 {
		t.Fatalf("AheadGone %d", st.AheadGone)
	}
	got, err := a.Get(ctx, "k")
	if err != nil || !bytes.Equal(got, testutil.Bytes(8192, 5)) {
		t.Fatalf("get: %v", err)
	}
}

// TestPutAheadFullPool: reservations never stop a put that needs their
// space: on NO_AVAILABLE_HANDLE the client gives them back and retries.
func TestPutAheadFullPool(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 8<<20, func(c *Config) { c.PutAhead = 8 })
	ctx := tctx(t)
	warmAhead(t, a, "small", 512<<10, ReplicateConfig{})
	fillAhead(t, a, "fill", 512<<10, ReplicateConfig{}, 8)
	if _, err := a.RemoveAll(ctx, true); err != nil {
		t.Fatal(err)
	}
	// Only the reservations are left: 4 MiB spread over the 8 MiB segment,
	// so 6 MiB fit only once they are given back.
	if st := tm.m.Stats(); st.Keys != 0 || st.Reservations != 8 {
		t.Fatalf("before: %+v", st)
	}
	v := testutil.Bytes(6<<20, 1)
	if err := a.Put(ctx, "big", v, ReplicateConfig{}); err != nil {
		t.Fatalf("put of 6 MiB: %v", err)
	}
	if got, err := a.Get(ctx, "big"); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("get: %v", err)
	}
	if st := tm.m.Stats(); st.Reservations != 0 {
		t.Fatalf("reservations kept: %d", st.Reservations)
	}
}

func TestPutAheadDisabled(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 16<<20, twoRPCPuts)
	ctx := tctx(t)
	for i := range 10 {
		if err := a.Put(ctx, fmt.Sprint(i), testutil.Bytes(4096, uint64(i)), ReplicateConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	if st := a.Stats(); st.PutsAhead != 0 || st.RPC["ReservePut"].Calls != 0 || tm.m.Stats().Reservations != 0 {
		t.Fatalf("put-ahead ran while disabled: %+v", st.RPC["ReservePut"])
	}
}

type storedSink struct {
	mu     sync.Mutex
	hashes map[string][]uint64
}

func (s *storedSink) Emit(e *master.Event) {
	if e.Kind != master.EventStored {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var h []uint64
	if e.Block != nil {
		h = e.Block.BlockHashes
	}
	s.hashes[e.Key] = h
}

// TestBatchPutAheadAndBlocks: a BatchPut of a class with reservations at
// hand is one CommitPut; a mixed batch commits some and starts the rest;
// rc.Blocks reach the master's Stored events either way.
func TestBatchPutAheadAndBlocks(t *testing.T) {
	sink := &storedSink{hashes: map[string][]uint64{}}
	tm := startMaster(t, master.Config{Events: sink})
	a := newTestClient(t, tm, 32<<20, func(c *Config) { c.PutAhead = 4 })
	ctx := tctx(t)
	warmAhead(t, a, "warm", 32<<10, ReplicateConfig{})
	fillAhead(t, a, "fill", 32<<10, ReplicateConfig{}, 4)
	before := a.Stats()
	keys := []string{"b0", "b1", "b2"}
	vals := [][]byte{testutil.Bytes(32<<10, 10), testutil.Bytes(32<<10, 11), testutil.Bytes(32<<10, 12)}
	rc := ReplicateConfig{Blocks: []*BlockMeta{{BlockHashes: []uint64{100}}, nil, {BlockHashes: []uint64{102}}}}
	for i, err := range a.BatchPut(ctx, keys, vals, rc) {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	after := a.Stats()
	if d := after.PutsAhead - before.PutsAhead; d != 3 {
		t.Fatalf("%d of 3 items went ahead", d)
	}
	if d := after.RPC["CommitPut"].Calls - before.RPC["CommitPut"].Calls; d != 1 {
		t.Fatalf("%d CommitPut calls", d)
	}
	if d := after.RPC["BatchPutStart"].Calls - before.RPC["BatchPutStart"].Calls; d != 0 {
		t.Fatalf("%d BatchPutStart calls", d)
	}
	// Six items with at most four reservations: both paths in one call.
	keys2 := []string{"m0", "m1", "m2", "m3", "m4", "m5"}
	var vals2 [][]byte
	var blocks2 []*BlockMeta
	for i := range keys2 {
		vals2 = append(vals2, testutil.Bytes(32<<10, uint64(20+i)))
		blocks2 = append(blocks2, &BlockMeta{BlockHashes: []uint64{uint64(200 + i)}})
	}
	for i, err := range a.BatchPut(ctx, keys2, vals2, ReplicateConfig{Blocks: blocks2}) {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	for i, k := range append(keys, keys2...) {
		want := append(vals, vals2...)[i]
		if got, err := a.Get(ctx, k); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("get %s: %v", k, err)
		}
	}
	sink.mu.Lock()
	for k, want := range map[string][]uint64{"b0": {100}, "b1": nil, "b2": {102}, "m0": {200}, "m5": {205}} {
		if got := sink.hashes[k]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s stored with hashes %v, want %v", k, got, want)
		}
	}
	sink.mu.Unlock()
	errs := a.BatchPut(ctx, []string{"x", "y"}, [][]byte{{1}, {2}}, ReplicateConfig{Blocks: []*BlockMeta{{}}})
	for _, err := range errs {
		if !errors.Is(err, errcode.ErrInvalidParams) {
			t.Fatalf("blocks of the wrong length: %v", errs)
		}
	}
}

// TestPutAheadConcurrent: many writers of two classes on two clients,
// every value read back intact from the other client; reservations stay
// within their budget and all go back at Close.
func TestPutAheadConcurrent(t *testing.T) {
	tm := startMaster(t, master.Config{})
	mk := func() *Client {
		// A class grows past PutAhead while its puts outnumber it; the
		// bytes budget (three values) is the bound that holds.
		return newTestClient(t, tm, 64<<20, func(c *Config) { c.PutAhead = 3; c.PutAheadBytes = 3 * 64 << 10; c.LocalBufferSize = 4 << 20 })
	}
	a, b := mk(), mk()
	ctx := tctx(t)
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for g := range 8 {
		wg.Go(func() {
			w, r := a, b
			if g%2 == 1 {
				w, r = b, a
			}
			rc := ReplicateConfig{Replicas: 1 + g%2}
			for i := range 40 {
				key := fmt.Sprintf("c-%d-%d", g, i)
				val := testutil.Bytes(64<<10, uint64(g*1000+i))
				if err := w.Put(ctx, key, val, rc); err != nil {
					errc <- fmt.Errorf("put %s: %w", key, err)
					return
				}
				if got, err := r.Get(ctx, key); err != nil || !bytes.Equal(got, val) {
					errc <- fmt.Errorf("get %s: %v", key, err)
					return
				}
				if st := tm.m.Stats(); st.Reservations > 2*2*3 {
					errc <- fmt.Errorf("%d reservations held, budget 12", st.Reservations)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if a.Stats().PutsAhead+b.Stats().PutsAhead == 0 {
		t.Fatal("no put went ahead")
	}
	if n := len(tm.m.AllKeys()); n != 8*40 {
		t.Fatalf("%d keys", n)
	}
	a.Close()
	b.Close()
	if st := tm.m.Stats(); st.Reservations != 0 {
		t.Fatalf("%d reservations after Close", st.Reservations)
	}
}

// A class whose puts find no reservation while replacements are on their
// way (more puts of it at once than PutAhead covers) gets more: each such
// miss raises its target by one, so the next CommitPut asks for an
// extra one, and the client converges to one round trip per put instead
// of paying two (two durability waits on a durable master) for the
// overflow. The bytes budget still bounds it.
func TestPutAheadGrowsWithConcurrency(t *testing.T) {
	a := newPutAhead(2, 1<<30)
	k := resvClass{size: 100}
	_, ok, refill, _ := a.take(k, time.Now())
	require.False(t, ok)
	require.Zero(t, refill, "a first miss asks for nothing")
	_, ok, refill, _ = a.take(k, time.Now())
	require.False(t, ok)
	require.Equal(t, 2, refill, "the second miss books perClass")
	for range 3 { // three puts while the two are asked for
		_, ok, _, _ = a.take(k, time.Now())
		require.False(t, ok)
	}
	a.got(k, 2, &storepb.ReserveResult{Reservations: []*storepb.Reservation{{Id: 1, Size: 100}, {Id: 2, Size: 100}}}, 10*time.Second, 0)
	n, _ := a.ask(k)
	assert.Equal(t, 3, n, "the next commit asks for one more per miss")

	small := newPutAhead(2, 350) // room for 3 of 100 bytes (and what is held)
	for range 6 {
		small.take(k, time.Now())
	}
	n, _ = small.ask(k)
	assert.Equal(t, 1, n, "two asked for, one more fits the budget")
	n, _ = small.ask(k)
	assert.Equal(t, 0, n, "the budget is full")
}

// TestBatchPutCommitBesideEnd: a batch whose items are partly reserved
// ahead and partly placed by BatchPutStart commits the first while it
// ends the second (on a durable master each RPC waits for the log, so
// one after the other would cost the batch two waits).
func TestBatchPutCommitBesideEnd(t *testing.T) {
	tm := startMaster(t, master.Config{})
	var armed atomic.Bool
	endStarted := make(chan struct{})
	var endOnce sync.Once
	var overlapped atomic.Bool
	// A refill that lands between the batch's takes would let it take a
	// fifth reservation, so refills wait until the batch is over.
	disarmed := make(chan struct{})
	a := newTestClient(t, tm, 32<<20, func(c *Config) {
		c.PutAhead = 4
		c.MasterProtocol = "grpc"
		c.MasterDialer = func(ctx context.Context, addr string, ic grpc.UnaryClientInterceptor) (MasterConn, error) {
			conn, _, err := DialMaster(ctx, addr, "grpc", func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if armed.Load() {
					switch {
					case strings.HasSuffix(method, "/ReservePut"):
						<-disarmed
					case strings.HasSuffix(method, "/PutEnd") || strings.HasSuffix(method, "/BatchPutEnd"):
						endOnce.Do(func() { close(endStarted) })
					case strings.HasSuffix(method, "/CommitPut"):
						// Hold the commit until the end is under way (or
						// give up: they ran one after the other).
						select {
						case <-endStarted:
							overlapped.Store(true)
						case <-time.After(2 * time.Second):
						}
					}
				}
				return ic(ctx, method, req, reply, cc, invoker, opts...)
			})
			return conn, err
		}
	})
	ctx := tctx(t)
	warmAhead(t, a, "warm", 32<<10, ReplicateConfig{})
	fillAhead(t, a, "fill", 32<<10, ReplicateConfig{}, 4)
	before := a.Stats()
	keys := []string{"m0", "m1", "m2", "m3", "m4", "m5"}
	var vals [][]byte
	for i := range keys {
		vals = append(vals, testutil.Bytes(32<<10, uint64(40+i)))
	}
	armed.Store(true)
	errs := a.BatchPut(ctx, keys, vals, ReplicateConfig{})
	armed.Store(false)
	close(disarmed)
	for i, err := range errs {
		require.NoError(t, err, "item %d", i)
	}
	after := a.Stats()
	assert.EqualValues(t, 4, after.PutsAhead-before.PutsAhead, "items committed ahead")
	assert.EqualValues(t, 1, after.RPC["BatchPutStart"].Calls-before.RPC["BatchPutStart"].Calls)
	assert.True(t, overlapped.Load(), "CommitPut waited for the end of the other items")
	for i, k := range keys {
		got, err := a.Get(ctx, k)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(vals[i], got), "value of %s", k)
	}
}

// TestPutAheadAboveMasterBound: a class whose target is more than the
// master grants in one spec (master.MaxReserveCount) still gets its
// reservations, over several requests, instead of asking for all at
// once, being refused and backing off.
func TestPutAheadAboveMasterBound(t *testing.T) {
	require.Equal(t, master.MaxReserveCount, maxReserveAsk, "the client's bound is the master's")
	tm := startMaster(t, master.Config{})
	target := 3*master.MaxReserveCount/2 + 1
	a := newTestClient(t, tm, 64<<20, func(c *Config) { c.PutAhead = target })
	warmAhead(t, a, "warm", 4<<10, ReplicateConfig{})
	assert.LessOrEqual(t, a.ahead.held(), target)
	before := a.Stats()
	puts := fillAhead(t, a, "k", 4<<10, ReplicateConfig{}, target)
	assert.EqualValues(t, puts, a.Stats().PutsAhead-before.PutsAhead, "every put went ahead")
	assert.Equal(t, target, tm.m.Stats().Reservations)
}

// bookedClass is a client's reservation queue whose class of 100-byte
// values has just booked its first perClass reservations (two puts found
// none), in the epoch returned.
func bookedClass(t *testing.T, perClass int) (*putAhead, resvClass, uint64) {
	t.Helper()
	a := newPutAhead(perClass, 1<<30)
	k := resvClass{size: 100}
	a.take(k, time.Now())
	_, _, refill, epoch := a.take(k, time.Now())
	require.Equal(t, perClass, refill)
	return a, k, epoch
}

// TestPutAheadForgetDropsOldAnswers: an answer to a request booked
// before a leader switch (forget) comes from the old leader: it is
// dropped, neither held nor given back to the new one, and does not
// disturb what the client books after the switch.
func TestPutAheadForgetDropsOldAnswers(t *testing.T) {
	a, k, old := bookedClass(t, 2)
	a.forget()
	two := func(id uint64) *storepb.ReserveResult {
		return &storepb.ReserveResult{Reservations: []*storepb.Reservation{{Id: id, Size: 100}, {Id: id + 1, Size: 100}}}
	}
	a.got(k, 2, two(1), 10*time.Second, old)
	assert.Zero(t, a.held(), "the old leader's reservations are held")
	assert.Empty(t, a.takeRelease(), "the old leader's reservations go to the new one")

	a.take(k, time.Now())
	_, _, refill, now := a.take(k, time.Now())
	require.Equal(t, 2, refill, "after the switch the class books afresh")
	require.NotEqual(t, old, now)
	a.got(k, 2, two(7), 10*time.Second, now)
	h, ok, _, _ := a.take(k, time.Now())
	require.True(t, ok)
	assert.EqualValues(t, 7, h.id)

	// A reservation taken before a switch and dropped or put back after
	// it is not given to the new leader, whose ids are its own.
	a.forget()
	a.drop(h)
	a.putBack(k, h)
	assert.Empty(t, a.takeRelease(), "an old leader's id released on the new one")
	assert.Zero(t, a.held())
}

// TestPutAheadAsksInChunks: a class tops its reservations up once half
// its target is missing, in one spec, not one spec per put: each spec
// costs the master a Reserve call. A class with none left asks at once.
func TestPutAheadAsksInChunks(t *testing.T) {
	a, k, ep := bookedClass(t, 8)
	res := &storepb.ReserveResult{}
	for i := range 8 {
		res.Reservations = append(res.Reservations, &storepb.Reservation{Id: uint64(i + 1), Size: 100})
	}
	a.got(k, 8, res, 10*time.Second, ep)
	for i := range 3 {
		_, ok, _, _ := a.take(k, time.Now())
		require.True(t, ok)
		n, _ := a.ask(k)
		assert.Zero(t, n, "%d of 8 missing: not yet", i+1)
	}
	_, ok, _, _ := a.take(k, time.Now())
	require.True(t, ok)
	n, _ := a.ask(k)
	assert.Equal(t, 4, n, "half missing: asked for together")
	for range 4 {
		_, ok, _, _ := a.take(k, time.Now())
		require.True(t, ok)
	}
	_, ok, _, _ = a.take(k, time.Now())
	require.False(t, ok, "all taken, the four still coming")
	a.got(k, 4, &storepb.ReserveResult{}, 10*time.Second, ep) // granted none
	n, _ = a.ask(k)
	assert.Equal(t, 9, n, "none held: the whole target (raised by the miss) at once")
}

// takeRelease is takeReleaseEpoch without the epoch.
func (a *putAhead) takeRelease() []uint64 {
	r, _ := a.takeReleaseEpoch()
	return r
}

// TestResvQueueOrder: the queue hands reservations out oldest first
// through pops, pushes that compact or grow its array, a put-back and a
// filter.
func TestResvQueueOrder(t *testing.T) {
	var q resvQueue
	push := func(from, to uint64) {
		for id := from; id <= to; id++ {
			q.push(heldResv{id: id})
		}
	}
	pop := func() uint64 { require.Positive(t, q.len()); return q.pop().id }
	push(1, 5)
	assert.Equal(t, uint64(1), pop())
	q.pushFront(heldResv{id: 1})
	assert.Equal(t, []uint64{1, 2, 3}, []uint64{pop(), pop(), pop()})
	push(6, 40) // past the array's capacity: compacted or grown, in order
	q.filter(func(h heldResv) bool { return h.id%2 == 1 })
	var got []uint64
	for q.len() > 0 {
		got = append(got, pop())
	}
	var want []uint64
	for id := uint64(5); id <= 39; id += 2 {
		want = append(want, id)
	}
	assert.Equal(t, want, got)
	assert.Zero(t, q.head, "an emptied queue starts its array over")
}

// TestPutAheadSteadyStateAllocs: taking reservations and filing their
// replacements reuses the class's array: no allocation per cycle once
// the queue has its size. (Reslicing from the front used to shrink the
// array's room on every take, so top-ups reallocated it.)
func TestPutAheadSteadyStateAllocs(t *testing.T) {
	a, k, ep := bookedClass(t, 8)
	batch := func(first uint64, n int) *storepb.ReserveResult {
		res := &storepb.ReserveResult{}
		for i := range n {
			res.Reservations = append(res.Reservations, &storepb.Reservation{Id: first + uint64(i), Size: 100})
		}
		return res
	}
	a.got(k, 8, batch(1, 8), 10*time.Second, ep)
	// Answers built beforehand, so the cycle allocates only what the
	// queue does.
	answers := make([]*storepb.ReserveResult, 200)
	for i := range answers {
		answers[i] = batch(uint64(100+4*i), 4)
	}
	i := 0
	allocs := testing.AllocsPerRun(100, func() {
		for range 4 {
			_, ok, _, _ := a.take(k, time.Now())
			require.True(t, ok)
		}
		n, e := a.ask(k)
		require.Equal(t, 4, n)
		a.got(k, n, answers[i], 10*time.Second, e)
		i++
	})
	assert.Zero(t, allocs)
	assert.Equal(t, 8, a.held())
}

// TestScratchPoolsKeepNoBuffers: after batch puts, the pooled scratch of
// rounds and transfers holds no reference to the values, keys or replies
// of the calls that used it.
func TestScratchPoolsKeepNoBuffers(t *testing.T) {
	a, s, _ := benchPair(t, "shm")
	ctx := tctx(t)
	const n = 16
	keys, vals := make([]string, n), make([][]byte, n)
	rc := ReplicateConfig{Preferred: []string{s.SegmentName()}}
	seenRound, seenXfer := false, false
	// The race detector drops some pooled items at random: try a few
	// times for a used scratch of each kind.
	for try := 0; try < 50 && !(seenRound && seenXfer); try++ {
		for i := range keys {
			keys[i], vals[i] = fmt.Sprintf("pool/%d/%d", try, i), testutil.Bytes(4<<10, uint64(try*n+i))
		}
		for _, err := range a.BatchPut(ctx, keys, vals, rc) {
			require.NoError(t, err)
		}
		if sc := roundScratchPool.Get().(*roundScratch); cap(sc.slab) > 0 {
			seenRound = true
			for _, x := range sc.slab[:cap(sc.slab)] {
				require.True(t, reflect.ValueOf(x).IsZero(), "a pooled xfer is not zero")
			}
			for _, x := range sc.xs[:cap(sc.xs)] {
				require.Nil(t, x)
			}
			for _, h := range sc.held[:cap(sc.held)] {
				require.True(t, reflect.ValueOf(h).IsZero(), "a pooled reserved item is not zero")
			}
			for _, q := range sc.qs[:cap(sc.qs)] {
				require.True(t, reflect.ValueOf(q).IsZero(), "a pooled commit item is not zero")
			}
		}
		if sc := xferScratchPool.Get().(*xferScratch); cap(sc.round) > 0 {
			seenXfer = true
			for _, p := range sc.round[:cap(sc.round)] {
				require.True(t, reflect.ValueOf(p).IsZero(), "a pooled piece is not zero")
			}
			for _, r := range sc.reqs[:cap(sc.reqs)] {
				require.True(t, reflect.ValueOf(r).IsZero(), "a pooled engine request is not zero")
			}
		}
	}
	assert.True(t, seenRound, "no used round scratch came back from the pool")
	assert.True(t, seenXfer, "no used transfer scratch came back from the pool")
}

// countConn counts the calls sent on it.
type countConn struct{ n atomic.Int32 }

func (c *countConn) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	c.n.Add(1)
	return nil
}

func (c *countConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("no streams")
}

func (c *countConn) Close() error { return nil }

// TestHASwitchRefusesOtherLeadersReservations: a switch forgets the
// put-ahead reservations before it publishes the new leader's
// connection, and a request composed with the old leader's reservations
// is never sent to the new leader, where their ids could name other
// reservations (a commit would bind a key to space its value was never
// written to). Unguarded calls and calls of the new epoch go through.
func TestHASwitchRefusesOtherLeadersReservations(t *testing.T) {
	a := newPutAhead(4, 1<<30)
	oldConn, newConn := &countConn{}, &countConn{}
	h := &haConn{log: slog.New(slog.DiscardHandler), beforeSwitch: func(LeaderView) uint64 { return a.forget() }}
	h.dial = func(context.Context, string) (MasterConn, string, error) { return newConn, "crpc", nil }
	h.state.Store(&haState{conn: oldConn, view: LeaderView{Leader: "a", Version: 1}, changed: make(chan struct{})})
	c := &Client{ha: h}
	ctx := context.Background()
	const method = "/crescent.store.Master/CommitPut"

	old := a.epoch
	require.NoError(t, h.Invoke(c.guardEpoch(ctx, old), method, nil, nil))
	assert.EqualValues(t, 1, oldConn.n.Load(), "the old leader's reservations go to the old leader")

	switched, err := h.switchLeader(ctx, LeaderView{Leader: "b", Version: 2})
	require.NoError(t, err)
	require.True(t, switched)
	assert.NotEqual(t, old, a.epoch, "reservations forgotten")
	assert.Equal(t, a.epoch, h.state.Load().epoch, "the new connection carries the new epoch")
	assert.EqualValues(t, 1, h.switches.Load())

	err = h.Invoke(c.guardEpoch(ctx, old), method, nil, nil)
	require.ErrorIs(t, err, errStaleReservations)
	assert.Zero(t, newConn.n.Load(), "a request with the old leader's reservations reached the new leader")

	require.NoError(t, h.Invoke(c.guardEpoch(ctx, a.epoch), method, nil, nil))
	require.NoError(t, h.Invoke(ctx, method, nil, nil))
	assert.EqualValues(t, 2, newConn.n.Load())
}
