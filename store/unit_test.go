package store

import (
	"bytes"
	"context"
	"errors"
	"github.com/stretchr/testify/require"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/storepb"
)

// Tests of the client's parts that need no master: memory, transfers
// between real engines, replica choice, the lease check, configuration.

// bareClient is a client without a master: its engine, staging pool and
// (unmounted) segment are real.
func bareClient(t testing.TB, protocols []string, segSize, stageSize int64) *Client {
	t.Helper()
	cfg := Config{LocalHostname: "127.0.0.1", Protocols: protocols, LocalBufferSize: stageSize, GlobalSegmentSize: segSize}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	c := newClient(cfg)
	if err := c.startMemory(); err != nil {
		t.Fatal(err)
	}
	if segSize > 0 {
		if err := c.addSegment(segSize); err != nil {
			c.teardown()
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if err := c.teardown(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	return c
}

// addSegment adds a segment of size bytes without mounting it.
func (c *Client) addSegment(size int64) error {
	seg, err := c.newSegment(size)
	if err != nil {
		return err
	}
	c.regs.add(seg.mem)
	c.setSegs(append(c.segList(), seg))
	return nil
}

func TestRegions(t *testing.T) {
	var r regions
	big := make([]byte, 1000)
	r.add(big[100:200])
	r.add(big[500:600])
	r.add(big[300:400])
	cases := []struct {
		name string
		b    []byte
		want bool
	}{
		{"inside first", big[100:200], true},
		{"inside middle", big[320:380], true},
		{"inside last", big[599:600], true},
		{"before", big[0:50], false},
		{"straddles end", big[150:250], false},
		{"straddles two", big[350:550], false},
		{"gap", big[200:300], false},
		{"empty", big[150:150], false},
		{"nil", nil, false},
	}
	for _, tc := range cases {
		if got := r.contains(tc.b); got != tc.want {
			t.Errorf("%s: contains = %v, want %v", tc.name, got, tc.want)
		}
	}
	if !r.remove(big[300:400]) || r.contains(big[320:380]) {
		t.Fatal("remove did not withdraw the region")
	}
	if r.remove(big[300:400]) {
		t.Fatal("second remove succeeded")
	}
}

func TestSegmentSliceBounds(t *testing.T) {
	mem := make([]byte, 4096)
	s := &segment{mem: mem, info: SegmentInfo{Base: 1 << 20, Size: 4096}}
	cases := []struct {
		addr, n uint64
		ok      bool
	}{
		{1 << 20, 4096, true},
		{1<<20 + 4000, 96, true},
		{1<<20 + 4000, 97, false},
		{1<<20 - 1, 10, false},
		{1<<20 + 10, ^uint64(0) - 5, false}, // overflow
		{^uint64(0) - 10, 20, false},
		{1<<20 + 4096, 0, true},
		{1<<20 + 4097, 0, false},
	}
	for _, tc := range cases {
		b, ok := s.slice(tc.addr, tc.n)
		if ok != tc.ok {
			t.Errorf("slice(%#x, %d) ok = %v, want %v", tc.addr, tc.n, ok, tc.ok)
		}
		if ok && uint64(len(b)) != tc.n {
			t.Errorf("slice(%#x, %d) len %d", tc.addr, tc.n, len(b))
		}
	}
}

func TestReplicateConfigCheck(t *testing.T) {
	cases := []struct {
		name string
		rc   ReplicateConfig
		ok   bool
	}{
		{"zero", ReplicateConfig{}, true},
		{"three replicas pinned", ReplicateConfig{Replicas: 3, SoftPin: true, SoftPinTTL: time.Minute, HardPin: true}, true},
		{"negative replicas", ReplicateConfig{Replicas: -1}, false},
		{"negative ttl", ReplicateConfig{SoftPin: true, SoftPinTTL: -time.Second}, false},
		{"ttl without pin", ReplicateConfig{SoftPinTTL: time.Second}, false},
		{"empty preferred", ReplicateConfig{Preferred: []string{""}}, false},
	}
	for _, tc := range cases {
		err := tc.rc.check()
		if (err == nil) != tc.ok {
			t.Errorf("%s: check = %v", tc.name, err)
		}
		if err != nil && !errors.Is(err, errcode.ErrInvalidParams) {
			t.Errorf("%s: %v is not INVALID_PARAMS", tc.name, err)
		}
	}
	pb := (&ReplicateConfig{Replicas: 2, SoftPin: true, SoftPinTTL: 1500 * time.Microsecond, Preferred: []string{"a:1"}, SameNode: true}).pb()
	if pb.ReplicaNum != 2 || !pb.WithSoftPin || pb.SoftPinTtlMs != 2 || pb.PreferredSegments[0] != "a:1" || !pb.PreferAllocInSameNode || pb.WithHardPin {
		t.Fatalf("pb = %v", pb)
	}
}

func TestConfigDefaults(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero", Config{}, true},
		{"bad master", Config{MasterAddr: "no-port"}, false},
		{"negative segment", Config{GlobalSegmentSize: -1}, false},
		{"negative buffer", Config{LocalBufferSize: -1}, false},
		{"negative heartbeat", Config{HeartbeatInterval: -time.Second}, false},
	}
	for _, tc := range cases {
		err := tc.cfg.setDefaults()
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
		if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v is not ErrInvalidConfig", tc.name, err)
		}
	}
	var c Config
	c.setDefaults()
	if c.MasterAddr != DefaultMasterAddr || c.LocalBufferSize != DefaultLocalBufferSize || c.HeartbeatInterval != time.Second || c.RPCTimeout != 10*time.Second || c.MaxKeyLen != 4096 {
		t.Fatalf("defaults: %+v", c)
	}
	// New refuses a bad config before touching anything.
	if _, err := New(context.Background(), Config{GlobalSegmentSize: -5}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with a negative segment size: %v", err)
	}
}

func TestCheckKey(t *testing.T) {
	c := newClient(Config{MaxKeyLen: 8, Logger: nil})
	c.cfg.MaxKeyLen = 8
	for _, k := range []string{"", "123456789"} {
		if err := c.checkKey(k); !errors.Is(err, errcode.ErrInvalidKey) {
			t.Errorf("checkKey(%q) = %v", k, err)
		}
	}
	if err := c.checkKey("12345678"); err != nil {
		t.Error(err)
	}
	c.cfg.MaxKeyLen = -1
	if err := c.checkKey(strings.Repeat("k", 1<<20)); err != nil {
		t.Errorf("no client-side limit: %v", err)
	}
}

func memReplica(seg string, addr, size uint64, st storepb.ReplicaStatus) *storepb.ReplicaDescriptor {
	return &storepb.ReplicaDescriptor{Type: storepb.ReplicaType_REPLICA_TYPE_MEMORY, Status: st,
		Memory: &storepb.MemoryDescriptor{SegmentName: seg, BufferAddress: addr, Size: size}}
}

func TestChooseReplicas(t *testing.T) {
	c := bareClient(t, []string{"tcp"}, 1<<20, 1<<20)
	base := c.segList()[0].info.Base
	complete := storepb.ReplicaStatus_REPLICA_STATUS_COMPLETE
	processing := storepb.ReplicaStatus_REPLICA_STATUS_PROCESSING
	sameHost := "127.0.0.1:1"
	other := "10.9.9.9:1"
	t.Run("local then host then other", func(t *testing.T) {
		size, refs, err := c.chooseReplicas("k", []*storepb.ReplicaDescriptor{
			memReplica(other, 1, 100, complete),
			memReplica(sameHost, 2, 100, complete),
			memReplica(c.name, base+64, 100, complete),
			memReplica(other, 3, 100, processing),
		})
		if err != nil || size != 100 {
			t.Fatal(size, err)
		}
		want := []replicaRef{{c.name, base + 64}, {sameHost, 2}, {other, 1}}
		if len(refs) != len(want) {
			t.Fatalf("refs %v", refs)
		}
		for i := range want {
			if refs[i] != want[i] {
				t.Fatalf("refs %v, want %v", refs, want)
			}
		}
	})
	t.Run("own name outside own memory is not local", func(t *testing.T) {
		_, refs, err := c.chooseReplicas("k", []*storepb.ReplicaDescriptor{
			memReplica(other, 1, 100, complete),
			memReplica(c.name, base+(1<<20)-50, 100, complete), // runs past the segment
		})
		if err != nil || refs[0].seg != c.name || refs[1].seg != other {
			t.Fatalf("refs %v err %v", refs, err)
		}
		if _, ok := c.localSlice(refs[0].seg, refs[0].addr, 100); ok {
			t.Fatal("out-of-segment range treated as local")
		}
	})
	t.Run("more replicas than the stack holds, into a shared array", func(t *testing.T) {
		// A batch carves every item's order from one array: the second
		// item's order must not overwrite the first's.
		dst := make([]replicaRef, 0, 8)
		_, first, err := c.chooseReplicasInto("a", []*storepb.ReplicaDescriptor{
			memReplica(other, 9, 100, complete),
			memReplica(sameHost, 8, 100, complete),
		}, dst)
		require.NoError(t, err)
		rest := first[len(first):]
		first = first[:len(first):len(first)]
		_, second, err := c.chooseReplicasInto("b", []*storepb.ReplicaDescriptor{
			memReplica(other, 1, 100, complete),
			memReplica(sameHost, 2, 100, processing),
			memReplica(other, 3, 100, complete),
			memReplica(sameHost, 4, 100, complete),
			memReplica(c.name, base+64, 100, complete),
			memReplica(sameHost, 6, 100, complete),
		}, rest)
		require.NoError(t, err)
		require.Same(t, &dst[:3][2], &second[0], "the second order is not in the shared array")
		require.Equal(t, []replicaRef{{sameHost, 8}, {other, 9}}, first)
		require.Equal(t, []replicaRef{{c.name, base + 64}, {sameHost, 4}, {sameHost, 6}, {other, 1}, {other, 3}}, second)
	})
	errCases := []struct {
		name string
		reps []*storepb.ReplicaDescriptor
		want error
	}{
		{"none", nil, errcode.ErrObjectNotFound},
		{"only processing", []*storepb.ReplicaDescriptor{memReplica(other, 1, 10, processing)}, errcode.ErrReplicaIsNotReady},
		{"sizes differ", []*storepb.ReplicaDescriptor{memReplica(other, 1, 10, complete), memReplica(sameHost, 1, 11, complete)}, errcode.ErrInvalidReplica},
		{"zero size", []*storepb.ReplicaDescriptor{memReplica(other, 1, 0, complete)}, errcode.ErrInvalidReplica},
		{"disk only", []*storepb.ReplicaDescriptor{{Type: storepb.ReplicaType_REPLICA_TYPE_DISK, Status: complete}}, errcode.ErrInvalidReplica},
	}
	for _, tc := range errCases {
		if _, _, err := c.chooseReplicas("k", tc.reps); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestWriteXfersRefusesBadReplicas(t *testing.T) {
	v := make([]byte, 100)
	complete := storepb.ReplicaStatus_REPLICA_STATUS_PROCESSING
	for name, reps := range map[string][]*storepb.ReplicaDescriptor{
		"none":      nil,
		"too small": {memReplica("a:1", 1, 99, complete)},
		"disk":      {{Type: storepb.ReplicaType_REPLICA_TYPE_DISK}},
		"no memory": {{Type: storepb.ReplicaType_REPLICA_TYPE_MEMORY}},
	} {
		if _, err := writeXfers("k", v, reps, 0); !errors.Is(err, errcode.ErrInvalidReplica) {
			t.Errorf("%s: %v", name, err)
		}
	}
	xs, err := writeXfers("k", v, []*storepb.ReplicaDescriptor{memReplica("a:1", 7, 128, complete), memReplica("b:1", 9, 100, complete)}, 3)
	if err != nil || len(xs) != 2 || xs[1].seg != "b:1" || xs[1].addr != 9 || xs[0].item != 3 {
		t.Fatalf("%v %v", xs, err)
	}
}

func TestLeaseCheck(t *testing.T) {
	c := newClient(Config{Logger: nil})
	fake := clock.NewFake(time.Unix(1000, 0))
	c.clock = fake
	deadline := fake.Now().Add(10 * time.Second)
	if err := c.checkLease("k", deadline); err != nil {
		t.Fatal(err)
	}
	fake.Advance(10 * time.Second)
	if err := c.checkLease("k", deadline); err != nil {
		t.Fatalf("at the deadline: %v", err)
	}
	fake.Advance(time.Millisecond)
	if err := c.checkLease("k", deadline); !errors.Is(err, errcode.ErrLeaseExpired) {
		t.Fatalf("after the deadline: %v", err)
	}
}

func TestHistogram(t *testing.T) {
	h := newHistogram()
	for _, d := range []time.Duration{10 * time.Microsecond, 50 * time.Microsecond, 51 * time.Microsecond, 2 * time.Millisecond, time.Minute} {
		h.observe(d)
	}
	s := h.snapshot()
	if s.Count != 5 || s.Counts[0] != 2 || s.Counts[1] != 1 || s.Counts[len(s.Counts)-1] != 1 {
		t.Fatalf("counts %v", s.Counts)
	}
	if s.Sum != 10*time.Microsecond+101*time.Microsecond+2*time.Millisecond+time.Minute {
		t.Fatalf("sum %v", s.Sum)
	}
	if q := s.Quantile(0.5); q != 75*time.Microsecond {
		t.Fatalf("p50 %v", q)
	}
	if q := s.Quantile(1); q != LatencyBounds[len(LatencyBounds)-1] {
		t.Fatalf("p100 %v", q)
	}
	if (Histogram{}).Quantile(0.5) != 0 {
		t.Fatal("empty quantile")
	}
}

func TestStagerWaitsForFree(t *testing.T) {
	s, err := newStager(1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.pool.Close()
	if s.chunk != 256<<10 {
		t.Fatalf("chunk %d", s.chunk)
	}
	held := fillStager(s)
	if len(held) < 3 {
		t.Fatalf("only %d chunks in a 1 MiB pool", len(held))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	if _, err := s.alloc(ctx, s.chunk); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("alloc on a full pool: %v", err)
	}
	cancel()
	got := make(chan []byte)
	go func() {
		b, _ := s.alloc(context.Background(), s.chunk)
		got <- b
	}()
	s.free(held[0])
	if b := <-got; len(b) != s.chunk {
		t.Fatalf("alloc after free: %d bytes", len(b))
	}
	// Views are capped at half the pool.
	for _, b := range held[1:] {
		s.free(b)
	}
	if v := s.allocView(600 << 10); v != nil {
		t.Fatal("view over half the pool granted")
	}
	v := s.allocView(400 << 10)
	if v == nil {
		t.Fatal("view refused")
	}
	s.freeView(v)
	if s.views != 0 {
		t.Fatalf("views %d after free", s.views)
	}
}

// TestTransferPaths moves data between two real engines: local copies,
// direct (registered) and staged (unregistered) writes and reads, values
// larger than the staging pool, over tcp and shm.
func TestTransferPaths(t *testing.T) {
	for _, proto := range []string{"tcp", "shm"} {
		t.Run(proto, func(t *testing.T) {
			a := bareClient(t, []string{proto}, 4<<20, 1<<20) // small staging: forces rounds
			b := bareClient(t, []string{proto}, 16<<20, 1<<20)
			bseg := b.segList()[0]
			ctx := context.Background()

			// A registered source buffer for the direct path.
			pool, err := mempool.New(mempool.Options{Size: 8 << 20, SlabSize: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			reg, _ := pool.Alloc(3 << 20)
			if err := a.eng.RegisterMemory(reg, "*"); err != nil {
				t.Fatal(err)
			}
			a.regs.add(reg)
			defer func() {
				a.regs.remove(reg)
				a.eng.UnregisterMemory(ctx, reg)
			}()

			sizes := []int{1, 4095, 64 << 10, 3 << 20}
			off := uint64(0)
			for _, n := range sizes {
				for _, direct := range []bool{false, true} {
					val := testutil.Bytes(n, uint64(n)*7+uint64(btoi(direct)))
					src := val
					if direct {
						src = reg[:n]
						copy(src, val)
					}
					staged0 := a.stats.staged.Load()
					addr := bseg.info.Base + off
					x := &xfer{op: engine.Write, buf: src, seg: b.name, addr: addr}
					a.transfer(ctx, []*xfer{x})
					if x.err != nil {
						t.Fatalf("write %d direct=%v: %v", n, direct, x.err)
					}
					if got, _ := bseg.slice(addr, uint64(n)); !bytes.Equal(got, val) {
						t.Fatalf("write %d direct=%v: target bytes differ", n, direct)
					}
					stagedW := a.stats.staged.Load() - staged0
					if direct && stagedW != 0 || !direct && stagedW != uint64(n) {
						t.Fatalf("write %d direct=%v staged %d bytes", n, direct, stagedW)
					}
					// Read back, into unregistered and registered memory.
					dst := make([]byte, n)
					if direct {
						dst = reg[:n]
						clear(dst)
					}
					r := &xfer{op: engine.Read, buf: dst, seg: b.name, addr: addr}
					a.transfer(ctx, []*xfer{r})
					if r.err != nil || !bytes.Equal(dst, val) {
						t.Fatalf("read %d direct=%v: %v", n, direct, r.err)
					}
					off += uint64(n+4095) &^ 4095
				}
			}
			// Local copies: A's own segment, no engine involved.
			aseg := a.segList()[0]
			val := testutil.Bytes(5000, 99)
			transfers := a.eng.Stats().Completed
			w := &xfer{op: engine.Write, buf: val, seg: a.name, addr: aseg.info.Base + 100}
			a.transfer(ctx, []*xfer{w})
			got := make([]byte, 5000)
			r := &xfer{op: engine.Read, buf: got, seg: a.name, addr: aseg.info.Base + 100}
			a.transfer(ctx, []*xfer{r})
			if w.err != nil || r.err != nil || !bytes.Equal(got, val) {
				t.Fatalf("local copy: %v %v", w.err, r.err)
			}
			if a.eng.Stats().Completed != transfers {
				t.Fatal("local copy went through the engine")
			}
			if s := a.Stats(); s.BytesWritten == 0 || s.BytesRead == 0 || s.StagedBytes == 0 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// TestTransferBatchMixed runs many xfers at once, some bad: the good ones
// complete, each bad one fails alone.
func TestTransferBatchMixed(t *testing.T) {
	a := bareClient(t, []string{"tcp"}, 0, 256<<10)
	b := bareClient(t, []string{"tcp"}, 8<<20, 1<<20)
	base := b.segList()[0].info.Base
	var xs []*xfer
	vals := make([][]byte, 20)
	for i := range vals {
		vals[i] = testutil.Bytes(100<<10, uint64(i))
		xs = append(xs, &xfer{op: engine.Write, buf: vals[i], seg: b.name, addr: base + uint64(i)*(128<<10), item: i})
	}
	outOfBounds := &xfer{op: engine.Write, buf: vals[0], seg: b.name, addr: base + (8 << 20) - 10, item: 20}
	noSeg := &xfer{op: engine.Write, buf: vals[0], seg: "127.0.0.1:1", addr: 4096, item: 21}
	xs = append(xs[:5], append([]*xfer{outOfBounds, noSeg}, xs[5:]...)...)
	a.transfer(context.Background(), xs)
	for _, x := range xs {
		bad := x == outOfBounds || x == noSeg
		if bad != (x.err != nil) {
			t.Fatalf("item %d: err %v", x.item, x.err)
		}
		if bad && !errors.Is(x.err, errcode.ErrTransferFail) {
			t.Fatalf("item %d: %v is not TRANSFER_FAIL", x.item, x.err)
		}
		if !bad {
			got, _ := b.segList()[0].slice(x.addr, uint64(len(x.buf)))
			if !bytes.Equal(got, x.buf) {
				t.Fatalf("item %d: bytes differ", x.item)
			}
		}
	}
}

// TestTransferDeadPeer: writes to a peer whose engine is gone fail with
// TRANSFER_FAIL, and the staging pool is whole again afterwards.
func TestTransferDeadPeer(t *testing.T) {
	a := bareClient(t, []string{"tcp"}, 0, 1<<20)
	peer := bareClient(t, []string{"tcp"}, 1<<20, 1<<20)
	addr := peer.segList()[0].info.Base
	ctx := context.Background()
	ok := &xfer{op: engine.Write, buf: []byte("hello"), seg: peer.name, addr: addr}
	a.transfer(ctx, []*xfer{ok})
	if ok.err != nil {
		t.Fatal(ok.err)
	}
	peer.eng.Close()
	x := &xfer{op: engine.Write, buf: testutil.Bytes(300<<10, 1), seg: peer.name, addr: addr}
	a.transfer(ctx, []*xfer{x})
	if !errors.Is(x.err, errcode.ErrTransferFail) {
		t.Fatalf("write to a closed engine: %v", x.err)
	}
	if st := a.stage.pool.Stats(); st.Allocs != 0 {
		t.Fatalf("%d staging allocations leaked", st.Allocs)
	}
}

// TestTransferConcurrentStaging: many goroutines staging through a pool
// that holds a few chunks at a time all finish (no deadlock) and move the
// right bytes.
func TestTransferConcurrentStaging(t *testing.T) {
	a := bareClient(t, []string{"tcp"}, 0, 256<<10)
	b := bareClient(t, []string{"tcp"}, 16<<20, 1<<20)
	base := b.segList()[0].info.Base
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			val := testutil.Bytes(1<<20, uint64(g))
			x := &xfer{op: engine.Write, buf: val, seg: b.name, addr: base + uint64(g)<<20}
			a.transfer(context.Background(), []*xfer{x})
			if x.err != nil {
				errs <- x.err
				return
			}
			got := make([]byte, len(val))
			r := &xfer{op: engine.Read, buf: got, seg: b.name, addr: base + uint64(g)<<20}
			a.transfer(context.Background(), []*xfer{r})
			if r.err != nil || !bytes.Equal(got, val) {
				errs <- errors.Join(errors.New("read back differs"), r.err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestTransferCancelled: a cancelled context fails the xfer promptly and
// gives the staging back.
func TestTransferCancelled(t *testing.T) {
	a := bareClient(t, []string{"tcp"}, 0, 1<<20)
	b := bareClient(t, []string{"tcp"}, 8<<20, 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	x := &xfer{op: engine.Write, buf: testutil.Bytes(4<<20, 3), seg: b.name, addr: b.segList()[0].info.Base}
	a.transfer(ctx, []*xfer{x})
	if x.err == nil {
		t.Fatal("cancelled transfer succeeded")
	}
	if st := a.stage.pool.Stats(); st.Allocs != 0 {
		t.Fatalf("%d staging allocations leaked", st.Allocs)
	}
}
