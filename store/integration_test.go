package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/storepb"
)

// Tests against a real master (store/master over gRPC on loopback) with
// clients that each have their own engine and contributed memory.

var valueSizes = []int{1, 63, 4095, 4096, 64<<10 + 1, 1 << 20, 8 << 20}

// TestPutGetAcrossClients puts on one client and gets on the other, with
// the replica placed on the writer (local write, remote read) and on the
// reader (remote write, local read), over tcp and over shm.
func TestPutGetAcrossClients(t *testing.T) {
	for _, proto := range []string{"tcp", "shm"} {
		t.Run(proto, func(t *testing.T) {
			tm := startMaster(t, master.Config{})
			a := newTestClient(t, tm, 64<<20, protocols(proto))
			b := newTestClient(t, tm, 64<<20, protocols(proto))
			ctx := tctx(t)
			for _, n := range valueSizes {
				for _, on := range []*Client{a, b} {
					key := fmt.Sprintf("v%d-on-%s", n, on.SegmentName())
					val := testutil.Bytes(n, uint64(n))
					if err := a.Put(ctx, key, val, ReplicateConfig{Preferred: []string{on.SegmentName()}}); err != nil {
						t.Fatalf("put %s: %v", key, err)
					}
					if got := segmentsOf(t, tm, key); !slices.Equal(got, []string{on.SegmentName()}) {
						t.Fatalf("%s placed on %v", key, got)
					}
					for _, reader := range []*Client{b, a} {
						got, err := reader.Get(ctx, key)
						if err != nil {
							t.Fatalf("get %s: %v", key, err)
						}
						if !bytes.Equal(got, val) {
							t.Fatalf("get %s: %d bytes differ from the %d put", key, len(got), n)
						}
					}
				}
			}
			sa, sb := a.Stats(), b.Stats()
			if sa.Puts != uint64(2*len(valueSizes)) || sa.PutFailures != 0 || sb.Gets != uint64(2*len(valueSizes)) {
				t.Fatalf("stats a %+v b %+v", sa, sb)
			}
			if sa.RPC["PutStart"].Calls != sa.Puts || sa.RPC["PutEnd"].Calls != sa.Puts || sb.RPC["GetReplicaList"].Calls != sb.Gets {
				t.Fatalf("rpc counts %+v", sa.RPC)
			}
			if sa.BytesWritten == 0 || sb.BytesRead == 0 {
				t.Fatalf("byte counters %+v %+v", sa, sb)
			}
		})
	}
}

func TestBatchPutGet(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 64<<20)
	b := newTestClient(t, tm, 64<<20)
	ctx := tctx(t)
	if err := a.Put(ctx, "dup", []byte("first"), ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	var keys []string
	var vals [][]byte
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("batch-%d", i))
		vals = append(vals, testutil.Bytes(1+i*7919, uint64(i)))
	}
	keys = append(keys, "", "dup", "empty-value")
	vals = append(vals, []byte("x"), []byte("second"), nil)
	errs := a.BatchPut(ctx, keys, vals, ReplicateConfig{Replicas: 2})
	for i, err := range errs[:40] {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	for i, want := range []error{errcode.ErrInvalidKey, errcode.ErrObjectAlreadyExists, errcode.ErrInvalidParams} {
		if !errors.Is(errs[40+i], want) {
			t.Errorf("item %q: %v, want %v", keys[40+i], errs[40+i], want)
		}
	}
	if got := segmentsOf(t, tm, "batch-7"); len(got) != 2 || got[0] == got[1] {
		t.Fatalf("2 replicas on distinct segments, got %v", got)
	}
	getKeys := append(slices.Clone(keys[:40]), "missing", "dup", "")
	got, gerrs := b.BatchGet(ctx, getKeys)
	for i := range 40 {
		if gerrs[i] != nil || !bytes.Equal(got[i], vals[i]) {
			t.Fatalf("get item %d: %v", i, gerrs[i])
		}
	}
	if !errors.Is(gerrs[40], errcode.ErrObjectNotFound) || got[40] != nil {
		t.Errorf("missing: %v", gerrs[40])
	}
	if gerrs[41] != nil || string(got[41]) != "first" {
		t.Errorf("dup: %q %v", got[41], gerrs[41])
	}
	if !errors.Is(gerrs[42], errcode.ErrInvalidKey) {
		t.Errorf("empty key: %v", gerrs[42])
	}
	// Mismatched lengths refuse every item.
	for _, err := range a.BatchPut(ctx, []string{"a", "b"}, [][]byte{[]byte("1")}, ReplicateConfig{}) {
		if !errors.Is(err, errcode.ErrInvalidParams) {
			t.Fatalf("mismatched batch: %v", err)
		}
	}
	// Batch existence and removal.
	found, xerrs := b.BatchIsExist(ctx, []string{"batch-0", "missing", ""}, NoLease())
	if !found[0] || found[1] || xerrs[0] != nil || xerrs[1] != nil || !errors.Is(xerrs[2], errcode.ErrInvalidKey) {
		t.Fatalf("BatchIsExist %v %v", found, xerrs)
	}
	rerrs := b.BatchRemove(ctx, []string{"batch-0", "batch-1", "missing"}, true)
	if rerrs[0] != nil || rerrs[1] != nil || !errors.Is(rerrs[2], errcode.ErrObjectNotFound) {
		t.Fatalf("BatchRemove %v", rerrs)
	}
	if st := a.Stats(); st.Puts != 1+43+2 || st.PutFailures != 3+2 {
		t.Fatalf("put counters %d/%d", st.Puts, st.PutFailures)
	}
}

// registered returns n bytes of mempool memory registered with c.
func registered(t *testing.T, c *Client, n int) []byte {
	t.Helper()
	p, err := mempool.New(mempool.Options{Size: int64(n), SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	b := p.Bytes()[:n:n]
	if err := c.RegisterBuffer(b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.UnregisterBuffer(b) // may already be gone with the client
		p.Close()
	})
	return b
}

// TestZeroCopy: PutFrom and GetInto with registered buffers move no byte
// through staging; unregistered buffers do.
func TestZeroCopy(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 0, protocols("tcp")) // pure client: every replica is remote
	newTestClient(t, tm, 64<<20, protocols("tcp"))
	ctx := tctx(t)
	const n = 3<<20 + 17
	src := registered(t, a, n)
	dst := registered(t, a, n)
	copy(src, testutil.Bytes(n, 5))

	staged := a.Stats().StagedBytes
	if err := a.PutFrom(ctx, "zc", src, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	clear(dst)
	if got, err := a.GetInto(ctx, "zc", dst); err != nil || got != n || !bytes.Equal(dst, src) {
		t.Fatalf("GetInto: %d %v", got, err)
	}
	if d := a.Stats().StagedBytes - staged; d != 0 {
		t.Fatalf("registered buffers staged %d bytes", d)
	}
	// A registered subrange works too, and a longer dst reports the size.
	if err := a.PutFrom(ctx, "zc-part", src[100:5000], ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	if got, err := a.GetInto(ctx, "zc-part", dst); err != nil || got != 4900 || !bytes.Equal(dst[:4900], src[100:5000]) {
		t.Fatalf("GetInto part: %d %v", got, err)
	}
	if d := a.Stats().StagedBytes - staged; d != 0 {
		t.Fatalf("registered buffers staged %d bytes", d)
	}
	// Unregistered memory goes through staging, with the same result.
	heap := testutil.Bytes(n, 6)
	if err := a.PutFrom(ctx, "heap", heap, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, n)
	if got, err := a.GetInto(ctx, "heap", out); err != nil || got != n || !bytes.Equal(out, heap) {
		t.Fatalf("GetInto heap: %d %v", got, err)
	}
	if d := a.Stats().StagedBytes - staged; d != 2*n {
		t.Fatalf("unregistered buffers staged %d bytes, want %d", d, 2*n)
	}
	// Too small a buffer.
	if _, err := a.GetInto(ctx, "zc", dst[:n-1]); !errors.Is(err, errcode.ErrBufferOverflow) {
		t.Fatalf("short dst: %v", err)
	}
	// Registration errors.
	if err := a.RegisterBuffer(src[10:20]); !errors.Is(err, errcode.ErrInvalidParams) || !errors.Is(err, engine.ErrAlreadyRegistered) {
		t.Fatalf("overlapping registration: %v", err)
	}
	if err := a.RegisterBuffer(nil); !errors.Is(err, errcode.ErrInvalidParams) {
		t.Fatalf("empty registration: %v", err)
	}
	if err := a.UnregisterBuffer(heap); !errors.Is(err, errcode.ErrInvalidParams) {
		t.Fatalf("unregister unknown: %v", err)
	}
	if err := a.UnregisterBuffer(src); err != nil {
		t.Fatal(err)
	}
	// After withdrawal it is plain memory: staged again, still correct.
	if err := a.PutFrom(ctx, "after", src[:1000], ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	if d := a.Stats().StagedBytes - staged; d != 2*n+1000 {
		t.Fatalf("withdrawn buffer staged %d bytes", d-2*n)
	}
}

func TestGetBuffer(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 32<<20)
	b := newTestClient(t, tm, 32<<20)
	ctx := tctx(t)
	local, remote := testutil.Bytes(100000, 1), testutil.Bytes(200000, 2)
	if err := a.Put(ctx, "local", local, ReplicateConfig{Preferred: []string{a.SegmentName()}}); err != nil {
		t.Fatal(err)
	}
	if err := a.Put(ctx, "remote", remote, ReplicateConfig{Preferred: []string{b.SegmentName()}}); err != nil {
		t.Fatal(err)
	}
	lb, err := a.GetBuffer(ctx, "local")
	if err != nil {
		t.Fatal(err)
	}
	if !lb.Local() || !bytes.Equal(lb.Bytes(), local) || lb.Len() != len(local) {
		t.Fatalf("local view: local=%v", lb.Local())
	}
	if _, ok := a.localSlice(a.name, spanOf(lb.Bytes()).addr, uint64(lb.Len())); !ok {
		t.Fatal("local view is not in the segment")
	}
	if time.Until(lb.LeaseDeadline()) <= 0 || time.Until(lb.LeaseDeadline()) > master.DefaultLeaseTTL {
		t.Fatalf("lease deadline %v", lb.LeaseDeadline())
	}
	rb, err := a.GetBuffer(ctx, "remote")
	if err != nil {
		t.Fatal(err)
	}
	if rb.Local() || !bytes.Equal(rb.Bytes(), remote) || !a.regs.contains(rb.Bytes()) {
		t.Fatalf("remote buffer: local=%v registered=%v", rb.Local(), a.regs.contains(rb.Bytes()))
	}
	rb.Release()
	rb.Release()
	if rb.Bytes() != nil || rb.Len() != 0 {
		t.Fatal("bytes after release")
	}
	if a.stage.views != 0 {
		t.Fatalf("staging views %d after release", a.stage.views)
	}
	if _, err := a.GetBuffer(ctx, "missing"); !errors.Is(err, errcode.ErrObjectNotFound) {
		t.Fatalf("missing: %v", err)
	}
	// A Buffer outlives Close: the memory stays mapped until released.
	rb2, err := a.GetBuffer(ctx, "remote")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(lb.Bytes(), local) || !bytes.Equal(rb2.Bytes(), remote) {
		t.Fatal("buffers changed after Close")
	}
	if _, err := a.GetBuffer(ctx, "local"); !errors.Is(err, ErrClosed) {
		t.Fatalf("GetBuffer after Close: %v", err)
	}
	lb.Close()
	rb2.Close()
	if !a.stage.pool.Stats().Closed || !a.segList()[0].pool.Stats().Closed {
		t.Fatal("memory still mapped after the last release")
	}
}

// TestIsExistLease: IsExist grants a lease that blocks a plain Remove;
// IsExist with NoLease does not.
func TestIsExistLease(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 16<<20)
	ctx := tctx(t)
	for _, k := range []string{"k1", "k2"} {
		if err := a.Put(ctx, k, []byte("value"), ReplicateConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := a.IsExist(ctx, "k1", NoLease()); !ok || err != nil {
		t.Fatalf("IsExist no lease: %v %v", ok, err)
	}
	if err := a.Remove(ctx, "k1", false); err != nil {
		t.Fatalf("remove after a lease-free probe: %v", err)
	}
	if ok, err := a.IsExist(ctx, "k2"); !ok || err != nil {
		t.Fatalf("IsExist: %v %v", ok, err)
	}
	if err := a.Remove(ctx, "k2", false); !errors.Is(err, errcode.ErrObjectHasLease) {
		t.Fatalf("remove of a leased key: %v", err)
	}
	if err := a.Remove(ctx, "k2", true); err != nil {
		t.Fatalf("forced remove: %v", err)
	}
	for _, k := range []string{"k1", "k2", "never"} {
		if ok, err := a.IsExist(ctx, k); ok || err != nil {
			t.Fatalf("IsExist(%s) after remove: %v %v", k, ok, err)
		}
	}
}

func TestRemove(t *testing.T) {
	tm := startMaster(t, master.Config{LeaseTTL: time.Second, EvictInterval: 10 * time.Millisecond})
	a := newTestClient(t, tm, 16<<20, twoRPCPuts)
	ctx := tctx(t)
	for i := range 10 {
		if err := a.Put(ctx, fmt.Sprintf("r/%d", i), []byte("v"), ReplicateConfig{HardPin: i == 0}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Remove(ctx, "missing", false); !errors.Is(err, errcode.ErrObjectNotFound) {
		t.Fatalf("remove missing: %v", err)
	}
	if n, err := a.RemoveByRegex(ctx, `r/[1-3]`, false); n != 3 || err != nil {
		t.Fatalf("RemoveByRegex: %d %v", n, err)
	}
	if _, err := a.RemoveByRegex(ctx, `(`, false); !errors.Is(err, errcode.ErrInvalidParams) {
		t.Fatalf("bad regex: %v", err)
	}
	if _, err := a.Get(ctx, "r/5"); err != nil { // leased now
		t.Fatal(err)
	}
	if n, err := a.RemoveAll(ctx, false); n != 6 || err != nil { // hard-pinned r/0 too
		t.Fatalf("RemoveAll skipping the leased key: %d %v", n, err)
	}
	if n, err := a.RemoveAll(ctx, true); n != 1 || err != nil {
		t.Fatalf("forced RemoveAll: %d %v", n, err)
	}
	if keys := tm.m.AllKeys(); len(keys) != 0 {
		t.Fatalf("keys left: %v", keys)
	}
	// The leased key's space is held until its lease ends, then freed.
	st, err := a.SegmentStatus(ctx, a.Segments()[0].ID)
	require.NoError(t, err)
	require.NotZero(t, st.Used, "a forced remove freed a leased object's space at once")
	eventually(t, "the held space freed", func() bool {
		st, err = a.SegmentStatus(ctx, a.Segments()[0].ID)
		return err == nil && st.Used == 0
	})
	if st.Capacity != 16<<20 || st.Status != storepb.SegmentStatus_SEGMENT_STATUS_OK || st.Name != a.SegmentName() {
		t.Fatalf("segment after RemoveAll: %+v %v", st, err)
	}
}

// TestReplicaPlacement: replica counts (best effort), distinct segments,
// preferred segments, and reads that survive the loss of one replica.
func TestReplicaPlacement(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 16<<20)
	b := newTestClient(t, tm, 16<<20)
	c := newTestClient(t, tm, 16<<20)
	ctx := tctx(t)
	val := testutil.Bytes(10000, 3)
	cases := []struct {
		key  string
		rc   ReplicateConfig
		want int
		on   []string
	}{
		{"one", ReplicateConfig{}, 1, nil},
		{"two", ReplicateConfig{Replicas: 2}, 2, nil},
		{"five", ReplicateConfig{Replicas: 5}, 3, nil}, // best effort: 3 segments
		{"pref-c", ReplicateConfig{Preferred: []string{c.SegmentName()}}, 1, []string{c.SegmentName()}},
		{"pref-bc", ReplicateConfig{Replicas: 2, Preferred: []string{c.SegmentName(), b.SegmentName()}}, 2, []string{c.SegmentName(), b.SegmentName()}},
		{"same-node", ReplicateConfig{SameNode: true}, 1, []string{a.SegmentName()}},
	}
	for _, tc := range cases {
		if err := a.Put(ctx, tc.key, val, tc.rc); err != nil {
			t.Fatalf("%s: %v", tc.key, err)
		}
		segs := segmentsOf(t, tm, tc.key)
		if len(segs) != tc.want {
			t.Fatalf("%s: %d replicas, want %d", tc.key, len(segs), tc.want)
		}
		if len(slices.Compact(slices.Sorted(slices.Values(segs)))) != len(segs) {
			t.Fatalf("%s: replicas share a segment: %v", tc.key, segs)
		}
		if tc.on != nil && !slices.Equal(slices.Sorted(slices.Values(segs)), slices.Sorted(slices.Values(tc.on))) {
			t.Fatalf("%s: on %v, want %v", tc.key, segs, tc.on)
		}
	}
	// Kill b's segment; "five" keeps replicas on a and c.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if segs := segmentsOf(t, tm, "five"); len(segs) != 2 || slices.Contains(segs, b.SegmentName()) {
		t.Fatalf("after b left: %v", segs)
	}
	for _, reader := range []*Client{a, c} {
		if got, err := reader.Get(ctx, "five"); err != nil || !bytes.Equal(got, val) {
			t.Fatalf("get after b left: %v", err)
		}
	}
}

// TestPutRevokedWhenTransferFails: the writer's PutStart reserved a local
// and a remote replica, then the remote segment's engine dies before the
// bytes are written; the put is revoked, nothing is visible and the space
// comes back.
func TestPutRevokedWhenTransferFails(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 16<<20, protocols("tcp"), twoRPCPuts, noRetries)
	eng, err := engine.New(engine.Config{LocalServerName: "127.0.0.1", Protocols: []string{"tcp"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	b := newTestClient(t, tm, 16<<20, func(c *Config) { c.Engine = eng })
	ctx := tctx(t)
	if err := a.Put(ctx, "fine", testutil.Bytes(1<<20, 1), ReplicateConfig{Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	if segs := segmentsOf(t, tm, "fine"); len(segs) != 2 {
		t.Fatalf("replicas %v", segs)
	}
	used := func(c *Client) uint64 {
		st, err := a.SegmentStatus(ctx, c.Segments()[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		return st.Used
	}
	usedA, usedB := used(a), used(b)
	a.beforeWrite = func() { eng.Close() } // b's engine dies between PutStart and the writes
	err = a.Put(ctx, "doomed", testutil.Bytes(1<<20, 2), ReplicateConfig{Replicas: 2})
	a.beforeWrite = nil
	if !errors.Is(err, errcode.ErrTransferFail) {
		t.Fatalf("put to a dead engine: %v", err)
	}
	if _, err := a.Get(ctx, "doomed"); !errors.Is(err, errcode.ErrObjectNotFound) {
		t.Fatalf("get after a failed put: %v", err)
	}
	if ok, err := a.IsExist(ctx, "doomed", NoLease()); ok || err != nil {
		t.Fatalf("exists after a failed put: %v %v", ok, err)
	}
	if _, err := tm.m.QueryKey("doomed"); !errors.Is(err, errcode.ErrObjectNotFound) {
		t.Fatalf("master still knows the key: %v", err)
	}
	if used(a) != usedA || used(b) != usedB {
		t.Fatalf("space not returned: a %d->%d b %d->%d", usedA, used(a), usedB, used(b))
	}
	// The same in a batch: every item revoked, per-item errors. (The
	// failed put reported b's segment, so only a minimum of two replicas
	// still places there.)
	a.beforeWrite = func() {}
	errs := a.BatchPut(ctx, []string{"d1", "d2"}, [][]byte{testutil.Bytes(5000, 1), testutil.Bytes(5000, 2)}, ReplicateConfig{Replicas: 2, MinReplicas: 2})
	for i, err := range errs {
		if !errors.Is(err, errcode.ErrTransferFail) {
			t.Fatalf("batch item %d: %v", i, err)
		}
	}
	if len(tm.m.AllKeys()) != 1 {
		t.Fatalf("keys %v", tm.m.AllKeys())
	}
	// The writer still works with what is left.
	if err := a.Put(ctx, "after", []byte("ok"), ReplicateConfig{Preferred: []string{a.SegmentName()}}); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseExpired: the client takes the lease TTL the master grants and
// discards a read that ended after it.
func TestLeaseExpired(t *testing.T) {
	const ttl = 300 * time.Millisecond
	tm := startMaster(t, master.Config{LeaseTTL: ttl})
	a := newTestClient(t, tm, 16<<20)
	b := newTestClient(t, tm, 16<<20)
	ctx := tctx(t)
	val := testutil.Bytes(50000, 9)
	if err := a.Put(ctx, "k", val, ReplicateConfig{Preferred: []string{a.SegmentName()}}); err != nil {
		t.Fatal(err)
	}
	fake := clock.NewFake(time.Now())
	b.clock = fake
	cases := []struct {
		advance time.Duration
		expired bool
	}{{ttl - 50*time.Millisecond, false}, {ttl + time.Millisecond, true}}
	for _, tc := range cases {
		b.afterRead = func() { fake.Advance(tc.advance) }
		_, err := b.Get(ctx, "k")
		if tc.expired != errors.Is(err, errcode.ErrLeaseExpired) || !tc.expired && err != nil {
			t.Fatalf("read taking %v of a %v lease: %v", tc.advance, ttl, err)
		}
		n, err := b.GetInto(ctx, "k", make([]byte, len(val)))
		if tc.expired != errors.Is(err, errcode.ErrLeaseExpired) || tc.expired && n != 0 {
			t.Fatalf("GetInto taking %v: %d %v", tc.advance, n, err)
		}
		buf, err := b.GetBuffer(ctx, "k")
		if tc.expired != errors.Is(err, errcode.ErrLeaseExpired) {
			t.Fatalf("GetBuffer taking %v: %v", tc.advance, err)
		}
		if buf != nil {
			buf.Release()
		}
		_, errs := b.BatchGet(ctx, []string{"k"})
		if tc.expired != errors.Is(errs[0], errcode.ErrLeaseExpired) {
			t.Fatalf("BatchGet taking %v: %v", tc.advance, errs[0])
		}
	}
	if b.stage.views != 0 || b.stage.pool.Stats().Allocs != 0 {
		t.Fatal("staging leaked after expired reads")
	}
	// The master's lease really is that short: once it ran out, a plain
	// Remove succeeds.
	eventually(t, "the master's lease to end", func() bool { return a.Remove(ctx, "k", false) == nil })
}

func TestBadInput(t *testing.T) {
	tm := startMaster(t, master.Config{MaxKeyLen: 100, MaxReplicas: 4})
	a := newTestClient(t, tm, 16<<20)
	raw := newTestClient(t, tm, 0, func(c *Config) { c.MaxKeyLen = -1 }) // leaves key checks to the master
	ctx := tctx(t)
	if err := a.Put(ctx, "exists", []byte("v"), ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("k", 5000)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"put empty key", a.Put(ctx, "", []byte("v"), ReplicateConfig{}), errcode.ErrInvalidKey},
		{"get empty key", func() error { _, err := a.Get(ctx, ""); return err }(), errcode.ErrInvalidKey},
		{"exist empty key", func() error { _, err := a.IsExist(ctx, ""); return err }(), errcode.ErrInvalidKey},
		{"remove empty key", a.Remove(ctx, "", true), errcode.ErrInvalidKey},
		{"put nil value", a.Put(ctx, "k", nil, ReplicateConfig{}), errcode.ErrInvalidParams},
		{"put empty value", a.PutFrom(ctx, "k", []byte{}, ReplicateConfig{}), errcode.ErrInvalidParams},
		{"oversize key (client)", a.Put(ctx, long, []byte("v"), ReplicateConfig{}), errcode.ErrInvalidKey},
		{"oversize key (master)", raw.Put(ctx, strings.Repeat("k", 101), []byte("v"), ReplicateConfig{}), errcode.ErrInvalidKey},
		{"get oversize key (master)", func() error { _, err := raw.Get(ctx, long); return err }(), errcode.ErrInvalidKey},
		{"duplicate put", a.Put(ctx, "exists", []byte("w"), ReplicateConfig{}), errcode.ErrObjectAlreadyExists},
		{"duplicate put from another client", raw.Put(ctx, "exists", []byte("w"), ReplicateConfig{}), errcode.ErrObjectAlreadyExists},
		{"get missing", func() error { _, err := a.Get(ctx, "missing"); return err }(), errcode.ErrObjectNotFound},
		{"get into missing", func() error { _, err := a.GetInto(ctx, "missing", make([]byte, 10)); return err }(), errcode.ErrObjectNotFound},
		{"negative replicas", a.Put(ctx, "k", []byte("v"), ReplicateConfig{Replicas: -1}), errcode.ErrInvalidParams},
		{"too many replicas", a.Put(ctx, "k", []byte("v"), ReplicateConfig{Replicas: 5}), errcode.ErrInvalidParams},
		{"soft pin TTL above max", a.Put(ctx, "k", []byte("v"), ReplicateConfig{SoftPin: true, SoftPinTTL: 48 * time.Hour}), errcode.ErrInvalidParams},
		{"soft pin TTL without pin", a.Put(ctx, "k", []byte("v"), ReplicateConfig{SoftPinTTL: time.Hour}), errcode.ErrInvalidParams},
		{"value larger than the pool", a.Put(ctx, "k", make([]byte, 17<<20), ReplicateConfig{}), errcode.ErrNoAvailableHandle},
	}
	for _, tc := range cases {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	// None of those left anything behind.
	if keys := tm.m.AllKeys(); !slices.Equal(keys, []string{"exists"}) {
		t.Fatalf("keys %v", keys)
	}
	if got, err := a.Get(ctx, "exists"); err != nil || string(got) != "v" {
		t.Fatalf("original value: %q %v", got, err)
	}
}

// TestHeartbeatRemount: a client that goes silent past the client TTL
// loses its segment and the objects stored only there; when it pings
// again it is told NEED_REMOUNT, mounts again and keeps working.
func TestHeartbeatRemount(t *testing.T) {
	tm := startMaster(t, master.Config{ClientTTL: time.Second, LivenessInterval: 50 * time.Millisecond})
	hb := func(c *Config) { c.HeartbeatInterval = 50 * time.Millisecond }
	a := newTestClient(t, tm, 16<<20, hb)
	b := newTestClient(t, tm, 16<<20, hb)
	pure := newTestClient(t, tm, 0, hb)
	ctx := tctx(t)
	if err := b.Put(ctx, "on-a", []byte("1"), ReplicateConfig{Preferred: []string{a.SegmentName()}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Put(ctx, "on-both", []byte("2"), ReplicateConfig{Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	// Well past the TTL with heartbeats on, nothing is lost.
	eventually(t, "heartbeats", func() bool { return a.Stats().Heartbeats >= 30 })
	if _, err := b.Get(ctx, "on-a"); err != nil {
		t.Fatalf("with heartbeats: %v", err)
	}
	if n := pure.Stats().Heartbeats; n != 0 {
		t.Fatalf("a pure client sent %d heartbeats", n)
	}
	segA := a.Segments()[0].ID
	a.hbPaused.Store(true)
	eventually(t, "a's segment to go", func() bool {
		_, err := b.SegmentStatus(ctx, segA)
		return errors.Is(err, errcode.ErrSegmentNotFound)
	})
	if _, err := b.Get(ctx, "on-a"); !errors.Is(err, errcode.ErrObjectNotFound) {
		t.Fatalf("object stored only on the expired client: %v", err)
	}
	if got, err := b.Get(ctx, "on-both"); err != nil || string(got) != "2" {
		t.Fatalf("object with a replica elsewhere: %q %v", got, err)
	}
	a.hbPaused.Store(false)
	eventually(t, "re-mount", func() bool {
		st, err := b.SegmentStatus(ctx, segA)
		return err == nil && st.Status == storepb.SegmentStatus_SEGMENT_STATUS_OK
	})
	// The master has the segment before the client counts the re-mount
	// (the count follows the RPC's answer).
	eventually(t, "the re-mount counted", func() bool { return a.Stats().Remounts >= 1 })
	if a.Stats().Remounts != 1 {
		t.Fatalf("remounts %d", a.Stats().Remounts)
	}
	if err := b.Put(ctx, "on-a-again", []byte("3"), ReplicateConfig{Preferred: []string{a.SegmentName()}}); err != nil {
		t.Fatal(err)
	}
	if got := segmentsOf(t, tm, "on-a-again"); !slices.Equal(got, []string{a.SegmentName()}) {
		t.Fatalf("placed on %v", got)
	}
	if got, err := a.Get(ctx, "on-a-again"); err != nil || string(got) != "3" {
		t.Fatalf("after re-mount: %q %v", got, err)
	}
}

// TestCloseUnmounts: Close unmounts the segments before anything else;
// keys stored only there go, calls afterwards get ErrClosed.
func TestCloseUnmounts(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 16<<20)
	b := newTestClient(t, tm, 16<<20)
	ctx := tctx(t)
	if err := b.Put(ctx, "on-a", []byte("x"), ReplicateConfig{Preferred: []string{a.SegmentName()}}); err != nil {
		t.Fatal(err)
	}
	segA := a.Segments()[0].ID
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := b.SegmentStatus(ctx, segA); !errors.Is(err, errcode.ErrSegmentNotFound) {
		t.Fatalf("segment after close: %v", err)
	}
	if _, err := b.Get(ctx, "on-a"); !errors.Is(err, errcode.ErrObjectNotFound) {
		t.Fatalf("key on a closed client: %v", err)
	}
	for name, err := range map[string]error{
		"Put":    a.Put(ctx, "k", []byte("v"), ReplicateConfig{}),
		"Remove": a.Remove(ctx, "k", false),
		"Ready":  a.Ready(ctx),
		"Batch":  a.BatchPut(ctx, []string{"k"}, [][]byte{[]byte("v")}, ReplicateConfig{})[0],
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after close: %v", name, err)
		}
	}
}

// TestMasterUnreachable: New fails with RPC_FAIL when nobody answers, and
// a running client reports the master gone through Ready.
func TestMasterUnreachable(t *testing.T) {
	tm := startMaster(t, master.Config{})
	addr := tm.addr
	a := newTestClient(t, tm, 0)
	ctx := tctx(t)
	if err := a.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	tm.stop()
	if err := a.Ready(ctx); !errors.Is(err, errcode.ErrRPCFail) {
		t.Fatalf("Ready with the master gone: %v", err)
	}
	if err := a.Put(ctx, "k", []byte("v"), ReplicateConfig{}); !errors.Is(err, errcode.ErrRPCFail) {
		t.Fatalf("Put with the master gone: %v", err)
	}
	for _, seg := range []int64{0, 1 << 20} {
		start := time.Now()
		_, err := New(ctx, Config{MasterAddr: addr, LocalHostname: "127.0.0.1", GlobalSegmentSize: seg, LocalBufferSize: 1 << 20, RPCTimeout: 2 * time.Second, Logger: quiet})
		if !errors.Is(err, errcode.ErrRPCFail) && !errors.Is(err, errcode.ErrRPCTimeout) {
			t.Fatalf("New(segment %d) without a master: %v", seg, err)
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("New took %v to fail", time.Since(start))
		}
	}
}

// TestConcurrentClients hammers two clients from many goroutines.
func TestConcurrentClients(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 64<<20, func(c *Config) { c.LocalBufferSize = 4 << 20 })
	b := newTestClient(t, tm, 64<<20, func(c *Config) { c.LocalBufferSize = 4 << 20 })
	ctx := tctx(t)
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for g := range 8 {
		wg.Go(func() {
			w, r := a, b
			if g%2 == 1 {
				w, r = b, a
			}
			for i := range 20 {
				key := fmt.Sprintf("c-%d-%d", g, i)
				val := testutil.Bytes(1+(g*i*4099)%(2<<20), uint64(g*100+i))
				if err := w.Put(ctx, key, val, ReplicateConfig{Replicas: 1 + i%2}); err != nil {
					errc <- fmt.Errorf("put %s: %w", key, err)
					return
				}
				got, err := r.Get(ctx, key)
				if err != nil || !bytes.Equal(got, val) {
					errc <- fmt.Errorf("get %s: %v", key, err)
					return
				}
				if buf, err := r.GetBuffer(ctx, key); err != nil || !bytes.Equal(buf.Bytes(), val) {
					errc <- fmt.Errorf("get buffer %s: %v", key, err)
					return
				} else {
					buf.Release()
				}
				if err := w.Remove(ctx, key, true); err != nil {
					errc <- fmt.Errorf("remove %s: %w", key, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if n := len(tm.m.AllKeys()); n != 0 {
		t.Fatalf("%d keys left", n)
	}
}

// TestNoLeaks: a master and clients started and closed leave no fd open
// (goroutines are checked by goleak for the whole package).
func TestNoLeaks(t *testing.T) {
	before := openFds(t)
	func() {
		tm := startMaster(t, master.Config{})
		a, err := New(context.Background(), Config{MasterAddr: tm.addr, LocalHostname: "127.0.0.1", GlobalSegmentSize: 8 << 20, LocalBufferSize: 4 << 20, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(context.Background(), Config{MasterAddr: tm.addr, LocalHostname: "127.0.0.1", GlobalSegmentSize: 8 << 20, LocalBufferSize: 4 << 20, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		ctx := tctx(t)
		for _, p := range [][2]*Client{{a, b}, {b, a}} {
			key := "leak-" + p[0].SegmentName()
			if err := p[0].Put(ctx, key, testutil.Bytes(1<<20, 1), ReplicateConfig{Preferred: []string{p[1].SegmentName()}}); err != nil {
				t.Fatal(err)
			}
			if _, err := p[1].Get(ctx, key); err != nil {
				t.Fatal(err)
			}
			if _, err := p[0].Get(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		tm.stop()
	}()
	eventually(t, "fds to close", func() bool { return openFds(t) <= before })
}

// ensure the pure-client path (no segment) needs no segment to read and
// write.
func TestPureClient(t *testing.T) {
	tm := startMaster(t, master.Config{})
	b := newTestClient(t, tm, 16<<20)
	p := newTestClient(t, tm, 0)
	ctx := tctx(t)
	if len(p.Segments()) != 0 || p.Stats().SegmentBytes != 0 {
		t.Fatal("pure client mounted memory")
	}
	if err := p.Put(ctx, "k", []byte("pure"), ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	if got := segmentsOf(t, tm, "k"); !slices.Equal(got, []string{b.SegmentName()}) {
		t.Fatalf("placed on %v", got)
	}
	if got, err := p.Get(ctx, "k"); err != nil || string(got) != "pure" {
		t.Fatalf("%q %v", got, err)
	}
	if err := p.Put(ctx, "k2", []byte("pure"), ReplicateConfig{SameNode: true}); err != nil {
		t.Fatalf("same-node put from a pure client: %v", err)
	}
}

// TestPartitionedClientRemounts: a client cut off from the master (its
// bytes held by a proxy, as in a partition: calls hang, and what it sent
// arrives late) past the client TTL loses its segment; once the network
// heals it mounts again by itself and serves puts and gets as before.
func TestPartitionedClientRemounts(t *testing.T) {
	tm := startMaster(t, master.Config{ClientTTL: time.Second, LivenessInterval: 50 * time.Millisecond})
	px := testutil.NewProxy(t, tm.addr)
	hb := func(c *Config) { c.HeartbeatInterval = 50 * time.Millisecond; c.RPCTimeout = 2 * time.Second }
	a := newTestClient(t, &testMaster{m: tm.m, addr: px.Addr()}, 16<<20, hb)
	b := newTestClient(t, tm, 16<<20, hb)
	ctx := tctx(t)
	onA := ReplicateConfig{Preferred: []string{a.SegmentName()}}
	require.NoError(t, b.Put(ctx, "on-a", []byte("1"), onA))
	require.NoError(t, b.Put(ctx, "on-b", []byte("2"), ReplicateConfig{Preferred: []string{b.SegmentName()}}))
	segA := a.Segments()[0].ID

	px.Partition(true)
	eventually(t, "the cut client's segment to go", func() bool {
		_, err := b.SegmentStatus(ctx, segA)
		return errors.Is(err, errcode.ErrSegmentNotFound)
	})
	_, err := b.Get(ctx, "on-a")
	require.ErrorIs(t, err, errcode.ErrObjectNotFound, "an object only on the expired segment")
	// A put through the cut connection fails for its caller, but its
	// request may still reach the master once healed: its outcome is
	// unknown, and its value whole either way.
	pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	require.Error(t, a.Put(pctx, "late", []byte("x"), ReplicateConfig{}), "a put through the cut connection")
	cancel()

	px.Partition(false)
	eventually(t, "the healed client to mount again", func() bool {
		st, err := b.SegmentStatus(ctx, segA)
		return err == nil && st.Status == storepb.SegmentStatus_SEGMENT_STATUS_OK
	})
	eventually(t, "the re-mount counted", func() bool { return a.Stats().Remounts >= 1 })
	require.NoError(t, b.Put(ctx, "on-a-again", []byte("3"), onA))
	assert.Equal(t, []string{a.SegmentName()}, segmentsOf(t, tm, "on-a-again"))
	got, err := a.Get(ctx, "on-b")
	require.NoError(t, err)
	assert.Equal(t, []byte("2"), got)
	// Stored whole, never stored, or begun and left unfinished (a late
	// PutStart: the master discards it at its put discard timeout).
	if got, err := b.Get(ctx, "late"); err == nil {
		assert.Equal(t, []byte("x"), got, "the late put's value")
	} else if !errors.Is(err, errcode.ErrReplicaIsNotReady) {
		require.ErrorIs(t, err, errcode.ErrObjectNotFound)
	}
	require.NoError(t, a.Put(ctx, "from-a", []byte("4"), ReplicateConfig{}))
	got, err = b.Get(ctx, "from-a")
	require.NoError(t, err)
	assert.Equal(t, []byte("4"), got)
}
