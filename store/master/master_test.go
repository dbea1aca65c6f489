package master

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

const seg1M = 1 << 20

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"shards", Config{Shards: -1}},
		{"watermark", Config{EvictionHighWatermark: 1.5}},
		{"ratio", Config{EvictionRatio: -0.1}},
		{"soft pin above max", Config{SoftPinTTL: time.Hour, MaxSoftPinTTL: time.Minute}},
		{"release before discard", Config{PutDiscardTimeout: time.Minute, PutReleaseTimeout: time.Second}},
		{"replicas", Config{MaxReplicas: 1000}},
		{"strategy", Config{Strategy: 7}},
		{"lease", Config{LeaseTTL: -time.Second}},
	} {
		if _, err := New(tc.cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	m, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := m.Config()
	if c.Shards != 1024 || c.LeaseTTL != 10*time.Second || c.EvictionRatio != 0.05 || c.EvictionHighWatermark != 0.9 ||
		c.ClientTTL != 10*time.Second || c.PutDiscardTimeout != 30*time.Second || c.PutReleaseTimeout != 600*time.Second ||
		c.SoftPinTTL != 30*time.Minute || c.MaxSoftPinTTL != 24*time.Hour || c.MaxKeyLen != 4096 || c.KeepSoftPinned {
		t.Fatalf("defaults %+v", c)
	}
	if m.ViewVersion() == 0 {
		t.Fatal("view version 0")
	}
}

// TestBadInput covers every bad input of the issue and a few more: each
// gets its error code and changes nothing.
func TestBadInput(t *testing.T) {
	e := newEnv(t, nil)
	a, b := cl(1), cl(2)
	sa := e.mount(a, "a", seg1M)
	e.put(a, "done", 100, ReplicateConfig{})
	if _, err := e.m.PutStart(a, "pending", 100, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("k", 4097)
	for _, tc := range []struct {
		name string
		do   func() error
		want error
	}{
		{"empty key", func() error { _, err := e.m.PutStart(a, "", 1, ReplicateConfig{}); return err }, errcode.ErrInvalidKey},
		{"oversize key", func() error { _, err := e.m.PutStart(a, long, 1, ReplicateConfig{}); return err }, errcode.ErrInvalidKey},
		{"key of max length", func() error {
			_, err := e.m.PutStart(a, long[:4096], 1, ReplicateConfig{})
			return err
		}, nil},
		{"invalid utf-8 key", func() error { _, err := e.m.PutStart(a, "\xff", 1, ReplicateConfig{}); return err }, errcode.ErrInvalidKey},
		{"size 0", func() error { _, err := e.m.PutStart(a, "k", 0, ReplicateConfig{}); return err }, errcode.ErrInvalidParams},
		{"too many replicas", func() error {
			_, err := e.m.PutStart(a, "k", 1, ReplicateConfig{Replicas: 17})
			return err
		}, errcode.ErrInvalidParams},
		{"negative replicas", func() error {
			_, err := e.m.PutStart(a, "k", 1, ReplicateConfig{Replicas: -1})
			return err
		}, errcode.ErrInvalidParams},
		{"soft pin TTL above max", func() error {
			_, err := e.m.PutStart(a, "k", 1, ReplicateConfig{SoftPin: true, SoftPinTTL: 25 * time.Hour})
			return err
		}, errcode.ErrInvalidParams},
		{"negative soft pin TTL", func() error {
			_, err := e.m.PutStart(a, "k", 1, ReplicateConfig{SoftPin: true, SoftPinTTL: -1})
			return err
		}, errcode.ErrInvalidParams},
		{"soft and hard pin", func() error {
			_, err := e.m.PutStart(a, "k", 1, ReplicateConfig{SoftPin: true, HardPin: true})
			return err
		}, errcode.ErrInvalidParams},
		{"empty preferred name", func() error {
			_, err := e.m.PutStart(a, "k", 1, ReplicateConfig{Preferred: []string{""}})
			return err
		}, errcode.ErrInvalidParams},
		{"object larger than any segment", func() error { _, err := e.m.PutStart(a, "k", 2*seg1M, ReplicateConfig{}); return err }, errcode.ErrNoAvailableHandle},
		{"object of 2^64-1 bytes", func() error { _, err := e.m.PutStart(a, "k", ^uint64(0), ReplicateConfig{}); return err }, errcode.ErrNoAvailableHandle},
		{"duplicate put of a complete key", func() error { _, err := e.m.PutStart(b, "done", 1, ReplicateConfig{}); return err }, errcode.ErrObjectAlreadyExists},
		{"duplicate put of an unfinished key", func() error {
			_, err := e.m.PutStart(b, "pending", 1, ReplicateConfig{})
			return err
		}, errcode.ErrObjectAlreadyExists},
		{"get of a missing key", func() error { _, _, err := e.m.GetReplicaList("missing"); return err }, errcode.ErrObjectNotFound},
		{"get of an unfinished key", func() error { _, _, err := e.m.GetReplicaList("pending"); return err }, errcode.ErrReplicaIsNotReady},
		{"get of an empty key", func() error { _, _, err := e.m.GetReplicaList(""); return err }, errcode.ErrInvalidKey},
		{"exist of an empty key", func() error { _, err := e.m.ExistKey("", false); return err }, errcode.ErrInvalidKey},
		{"PutEnd of a missing key", func() error { return e.m.PutEnd(a, "missing", Memory, nil) }, errcode.ErrObjectNotFound},
		{"PutEnd from another client", func() error { return e.m.PutEnd(b, "pending", Memory, nil) }, errcode.ErrIllegalClient},
		{"PutEnd of a disk replica", func() error { return e.m.PutEnd(a, "pending", Disk, nil) }, errcode.ErrInvalidParams},
		{"PutRevoke from another client", func() error { return e.m.PutRevoke(b, "pending", Memory) }, errcode.ErrIllegalClient},
		{"PutRevoke of a complete key", func() error { return e.m.PutRevoke(a, "done", Memory) }, errcode.ErrInvalidWrite},
		{"PutRevoke of a missing key", func() error { return e.m.PutRevoke(a, "missing", Memory) }, errcode.ErrObjectNotFound},
		{"Remove of a missing key", func() error { return e.m.Remove("missing", false) }, errcode.ErrObjectNotFound},
		{"Remove of an unfinished put", func() error { return e.m.Remove("pending", false) }, errcode.ErrObjectReplicaBusy},
		{"bad regex", func() error { _, err := e.m.RemoveByRegex("(", false); return err }, errcode.ErrInvalidParams},
		{"mount with zero client", func() error { return e.m.MountSegment(UUID{}, alloc.Segment{ID: UUID{Lo: 99}, Name: "x", Size: seg1M}) }, errcode.ErrInvalidParams},
		{"mount of a known segment", func() error { return e.m.MountSegment(a, sa) }, errcode.ErrSegmentAlreadyExists},
		{"mount of size 0", func() error { return e.m.MountSegment(a, alloc.Segment{ID: UUID{Lo: 98}, Name: "x"}) }, errcode.ErrInvalidParams},
		{"unmount of an unknown segment", func() error { return e.m.UnmountSegment(a, UUID{Lo: 77}) }, errcode.ErrSegmentNotFound},
		{"unmount of another client's segment", func() error { return e.m.UnmountSegment(b, sa.ID) }, errcode.ErrIllegalClient},
		{"remount of another client's segment", func() error { return e.m.ReMountSegment(b, []alloc.Segment{sa}) }, errcode.ErrSegmentAlreadyExists},
		{"status of an unknown segment", func() error { _, err := e.m.QuerySegmentStatus(UUID{Lo: 77}); return err }, errcode.ErrSegmentNotFound},
		{"batch with fewer sizes", func() error {
			_, err := e.m.BatchPutStart(a, []string{"x", "y"}, []uint64{1}, ReplicateConfig{})
			return err
		}, errcode.ErrInvalidParams},
		{"batch end with fewer blocks", func() error {
			_, err := e.m.BatchPutEnd(a, []string{"x", "y"}, Memory, []*BlockMeta{nil})
			return err
		}, errcode.ErrInvalidParams},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := dumpState(e.m)
			err := tc.do()
			wantErr(t, tc.name, err, tc.want)
			if tc.want != nil {
				if d := diffState(before, dumpState(e.m)); d != "" {
					t.Fatalf("state changed:\n%s", d)
				}
			}
		})
	}
	if n := e.m.Stats().EvictionRuns; n != 0 {
		t.Fatalf("objects no segment can hold triggered %d eviction rounds", n)
	}
	checkInvariants(t, e.m)
}

func TestPutGetRevoke(t *testing.T) {
	e := newEnv(t, nil)
	a := cl(1)
	s := e.mount(a, "host:1", seg1M)
	reps, err := e.m.PutStart(a, "k", 1000, ReplicateConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 1 {
		t.Fatalf("%d replicas", len(reps))
	}
	r := reps[0]
	if r.Status != StatusProcessing || r.Type != Memory || r.SegmentName != "host:1" || r.SegmentID != s.ID ||
		r.Size != 1000 || r.Protocol != "tcp" || r.Addr < s.Base || r.Addr+1000 > s.Base+s.Size {
		t.Fatalf("replica %+v", r)
	}
	if ok := e.exists("k"); ok {
		t.Fatal("unfinished put exists")
	}
	if err := e.m.PutEnd(a, "k", Memory, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.m.PutEnd(a, "k", Memory, nil); err != nil {
		t.Fatalf("retried PutEnd: %v", err)
	}
	got, ttl, err := e.m.GetReplicaList("k")
	if err != nil || ttl != 10*time.Second {
		t.Fatal(err, ttl)
	}
	r.Status = StatusComplete
	if !slices.Equal(got, []Replica{r}) {
		t.Fatalf("got %+v, want %+v", got, r)
	}
	// Revoke frees at once.
	if _, err := e.m.PutStart(a, "r", 5000, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	used := e.m.Stats().Allocated
	if err := e.m.PutRevoke(a, "r", Memory); err != nil {
		t.Fatal(err)
	}
	if now := e.m.Stats().Allocated; now != used-alloc.Reserved(5000) {
		t.Fatalf("allocated %d after revoke, was %d", now, used)
	}
	if e.exists("r") {
		t.Fatal("revoked key exists")
	}
	info, err := e.m.QueryKey("k")
	if err != nil || !info.Complete || !info.Leased || info.Size != 1000 {
		t.Fatalf("QueryKey = %+v, %v", info, err)
	}
	if keys := e.m.AllKeys(); !slices.Equal(keys, []string{"k"}) {
		t.Fatalf("AllKeys = %v", keys)
	}
	checkInvariants(t, e.m)
}

func TestLeases(t *testing.T) {
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name    string
		access  func(m *Master) // at t0+1s
		leased  bool
		advance time.Duration // then this much later
		removed error         // Remove(force=false) then
	}{
		{"no access: no lease", func(m *Master) {}, false, 0, nil},
		{"get grants", func(m *Master) { m.GetReplicaList("k") }, true, 0, errcode.ErrObjectHasLease},
		{"exist grants", func(m *Master) { m.ExistKey("k", false) }, true, 0, errcode.ErrObjectHasLease},
		{"no_lease probe does not", func(m *Master) { m.ExistKey("k", true) }, false, 0, nil},
		{"batch get grants", func(m *Master) { m.BatchGetReplicaList([]string{"k"}) }, true, 0, errcode.ErrObjectHasLease},
		{"batch exist without lease does not", func(m *Master) { m.BatchExistKey([]string{"k"}, true) }, false, 0, nil},
		{"lease in force just before expiry", func(m *Master) { m.GetReplicaList("k") }, true, ttl - time.Nanosecond, errcode.ErrObjectHasLease},
		{"lease expires", func(m *Master) { m.GetReplicaList("k") }, true, ttl, nil},
		{"lease is extended, never shortened", func(m *Master) {
			m.GetReplicaList("k")
			e := m.clk.(interface{ Advance(time.Duration) })
			e.Advance(5 * time.Second)
			m.ExistKey("k", false)
		}, true, ttl - time.Second, errcode.ErrObjectHasLease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.mount(cl(1), "a", seg1M)
			e.put(cl(1), "k", 100, ReplicateConfig{})
			e.clk.Advance(time.Second)
			tc.access(e.m)
			info, _ := e.m.QueryKey("k")
			if info.Leased != tc.leased {
				t.Fatalf("leased %v, want %v", info.Leased, tc.leased)
			}
			e.clk.Advance(tc.advance)
			wantErr(t, "Remove", e.m.Remove("k", false), tc.removed)
			if tc.removed != nil {
				wantErr(t, "forced Remove", e.m.Remove("k", true), nil)
			}
			if e.exists("k") {
				t.Fatal("still there")
			}
			checkInvariants(t, e.m)
		})
	}
}

func TestSoftPin(t *testing.T) {
	const segSize = 1 << 20
	const obj = 64 << 10 // 16 per segment; eviction target 5% = 1 object
	type step struct {
		advance time.Duration
		get     bool
	}
	for _, tc := range []struct {
		name      string
		cfg       func(*Config)
		rc        ReplicateConfig
		steps     []step
		evictWant bool // is the pinned object evicted by one round?
		pass2     bool
	}{
		{"pinned survives pass 1, taken in pass 2", nil, ReplicateConfig{SoftPin: true}, nil, true, true},
		{"KeepSoftPinned never evicts it", func(c *Config) { c.KeepSoftPinned = true }, ReplicateConfig{SoftPin: true}, nil, false, false},
		{"pin expires after default TTL", func(c *Config) { c.KeepSoftPinned = true }, ReplicateConfig{SoftPin: true},
			[]step{{advance: 30 * time.Minute}}, true, false},
		{"custom TTL", func(c *Config) { c.KeepSoftPinned = true }, ReplicateConfig{SoftPin: true, SoftPinTTL: time.Minute},
			[]step{{advance: time.Minute}}, true, false},
		{"custom TTL not yet over", func(c *Config) { c.KeepSoftPinned = true }, ReplicateConfig{SoftPin: true, SoftPinTTL: time.Minute},
			[]step{{advance: time.Minute - 2*time.Second}}, false, false},
		{"get renews the pin", func(c *Config) { c.KeepSoftPinned = true }, ReplicateConfig{SoftPin: true, SoftPinTTL: time.Minute},
			[]step{{advance: 50 * time.Second, get: true}, {advance: 50 * time.Second}}, false, false},
		{"TTL at the maximum is accepted", func(c *Config) { c.KeepSoftPinned = true; c.MaxSoftPinTTL = time.Hour },
			ReplicateConfig{SoftPin: true, SoftPinTTL: time.Hour}, []step{{advance: 59 * time.Minute}}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.cfg)
			e.mount(cl(1), "a", segSize)
			e.put(cl(1), "pinned", obj, tc.rc)
			for _, s := range tc.steps {
				e.clk.Advance(s.advance)
				if s.get {
					if _, _, err := e.m.GetReplicaList("pinned"); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Another object, leased: the first pass finds nothing else, so
			// only the pin protects "pinned".
			e.put(cl(1), "plain", obj, ReplicateConfig{})
			e.m.GetReplicaList("plain")
			if st := e.m.Stats(); st.SoftPinnedKeys != 1 {
				t.Fatalf("soft-pinned keys %d", st.SoftPinnedKeys)
			}
			e.clk.Advance(time.Second)
			r := e.m.Evict()
			if got := !e.exists("pinned"); got != tc.evictWant {
				t.Fatalf("pinned evicted %v, want %v (round %+v)", got, tc.evictWant, r)
			}
			if r.Pass2 != tc.pass2 {
				t.Fatalf("pass 2 %v, want %v", r.Pass2, tc.pass2)
			}
			checkInvariants(t, e.m)
		})
	}
}

func TestHardPin(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "a", seg1M)
	e.put(cl(1), "hard", 64<<10, ReplicateConfig{HardPin: true})
	e.put(cl(1), "hard2", 64<<10, ReplicateConfig{HardPin: true})
	e.clk.Advance(time.Hour)
	for range 5 {
		if r := e.m.Evict(); r.Keys != 0 || !r.Pass2 {
			t.Fatalf("evicted %+v", r)
		}
	}
	if !e.exists("hard") || e.m.Stats().HardPinnedKeys != 2 {
		t.Fatal("hard-pinned object evicted")
	}
	wantErr(t, "Remove", e.m.Remove("hard", false), nil)
	e.m.GetReplicaList("hard2")
	if n, err := e.m.RemoveAll(false); n != 0 || err != nil {
		t.Fatalf("RemoveAll of a leased hard pin = %d, %v", n, err)
	}
	e.clk.Advance(time.Minute)
	if n, err := e.m.RemoveAll(false); n != 1 || err != nil {
		t.Fatalf("RemoveAll = %d, %v", n, err)
	}
	if e.m.Stats().Keys != 0 || e.m.Stats().HardPinnedKeys != 0 {
		t.Fatalf("stats %+v", e.m.Stats())
	}
	checkInvariants(t, e.m)
}

// TestEvictionOrder puts objects with known lease histories and checks
// which ones a round takes: never-leased first (by PutEnd time), then by
// lease deadline; leased, hard-pinned and unfinished ones never; and just
// enough to free the ratio of capacity.
func TestEvictionOrder(t *testing.T) {
	const obj = 64 << 10 // reserved exactly 64 KiB
	for _, tc := range []struct {
		name    string
		ratio   float64
		setup   func(e *env) // objects o0..o9 exist, put 1s apart
		evicted []string
	}{
		{"never leased, oldest first", 0.05, func(e *env) {}, []string{"o0"}},
		{"amount is the ratio of capacity", 0.2, func(e *env) {}, []string{"o0", "o1", "o2", "o3"}},
		{"a leased object counts as younger", 0.1, func(e *env) {
			e.m.GetReplicaList("o0") // lease to t+10s, expires
			e.clk.Advance(11 * time.Second)
		}, []string{"o1", "o2"}},
		{"oldest lease first", 0.1, func(e *env) {
			for _, k := range []string{"o5", "o3", "o7", "o1"} {
				for i := range 10 {
					if i != 5 && i != 3 && i != 7 && i != 1 {
						e.m.GetReplicaList("o" + string(rune('0'+i)))
					}
				}
				e.m.GetReplicaList(k)
				e.clk.Advance(time.Second)
			}
			e.clk.Advance(20 * time.Second)
		}, []string{"o3", "o5"}},
		{"live leases are skipped", 0.1, func(e *env) {
			e.m.GetReplicaList("o0")
			e.m.ExistKey("o1", false)
		}, []string{"o2", "o3"}},
		{"hard pins and unfinished puts are skipped", 0.1, func(e *env) {
			e.m.Remove("o0", true)
			e.m.Remove("o1", true)
			e.clk.Advance(time.Second)
			if _, err := e.m.PutStart(cl(1), "o0", obj, ReplicateConfig{HardPin: true}); err != nil {
				e.t.Fatal(err)
			}
			e.m.PutEnd(cl(1), "o0", Memory, nil)
			if _, err := e.m.PutStart(cl(1), "o1", obj, ReplicateConfig{}); err != nil {
				e.t.Fatal(err)
			}
		}, []string{"o2", "o3"}},
		{"everything protected: nothing", 0.1, func(e *env) {
			for i := range 10 {
				e.m.GetReplicaList("o" + string(rune('0'+i)))
			}
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.EvictionRatio = tc.ratio })
			e.mount(cl(1), "a", 1<<20) // 16 objects
			var keys []string
			for i := range 10 {
				k := "o" + string(rune('0'+i))
				keys = append(keys, k)
				e.put(cl(1), k, obj, ReplicateConfig{})
				e.clk.Advance(time.Second)
			}
			tc.setup(e)
			e.ev.take()
			r := e.m.Evict()
			var gone []string
			for _, k := range keys {
				if _, err := e.m.QueryKey(k); err != nil {
					gone = append(gone, k)
				}
			}
			if !slices.Equal(gone, tc.evicted) {
				t.Fatalf("evicted %v, want %v (round %+v)", gone, tc.evicted, r)
			}
			if r.Keys != len(tc.evicted) || r.Bytes != uint64(len(tc.evicted))*obj {
				t.Fatalf("round %+v", r)
			}
			var evs []string
			for _, ev := range e.ev.take() {
				if ev.Kind != EventRemoved || ev.Reason != ReasonEvicted {
					t.Fatalf("event %+v", ev)
				}
				evs = append(evs, ev.Key)
			}
			slices.Sort(evs)
			if !slices.Equal(evs, tc.evicted) {
				t.Fatalf("events for %v", evs)
			}
			if st := e.m.Stats(); st.EvictedKeys != uint64(r.Keys) || st.EvictionRuns != 1 {
				t.Fatalf("stats %+v", st)
			}
			checkInvariants(t, e.m)
		})
	}
}

func TestEvictionTriggers(t *testing.T) {
	const obj = 64 << 10
	t.Run("watermark", func(t *testing.T) {
		e := newEnv(t, nil)
		e.mount(cl(1), "a", 1<<20)
		for i := range 14 { // 14/16 = 0.875: below 0.90
			e.put(cl(1), "k"+string(rune('a'+i)), obj, ReplicateConfig{})
			e.clk.Advance(time.Millisecond)
		}
		e.m.Tick()
		if st := e.m.Stats(); st.EvictionRuns != 0 || st.Keys != 14 {
			t.Fatalf("below the watermark: %+v", st)
		}
		e.put(cl(1), "kz", obj, ReplicateConfig{}) // 15/16 = 0.9375
		e.m.Tick()
		if st := e.m.Stats(); st.EvictionRuns != 1 || st.Keys != 14 || !e.exists("kz") || e.exists("ka") {
			t.Fatalf("above the watermark: %+v", st)
		}
	})
	t.Run("allocation failure", func(t *testing.T) {
		e := newEnv(t, nil)
		e.mount(cl(1), "a", 1<<20)
		for i := range 16 {
			e.put(cl(1), "k"+string(rune('a'+i)), obj, ReplicateConfig{})
			e.clk.Advance(time.Millisecond)
		}
		if _, err := e.m.PutStart(cl(1), "new", obj, ReplicateConfig{}); err != nil {
			t.Fatalf("PutStart on a full pool: %v", err)
		}
		if st := e.m.Stats(); st.EvictionRuns != 1 || st.EvictedKeys != 1 || e.exists("ka") {
			t.Fatalf("stats %+v", st)
		}
		checkInvariants(t, e.m)
	})
	t.Run("allocation failure with nothing evictable", func(t *testing.T) {
		e := newEnv(t, nil)
		e.mount(cl(1), "a", 1<<20)
		for i := range 16 {
			e.put(cl(1), "k"+string(rune('a'+i)), obj, ReplicateConfig{HardPin: true})
		}
		_, err := e.m.PutStart(cl(1), "new", obj, ReplicateConfig{})
		wantErr(t, "PutStart", err, errcode.ErrNoAvailableHandle)
		if e.m.Stats().EvictionRuns != 1 {
			t.Fatal("no eviction round was tried")
		}
	})
	t.Run("fruitless rounds back off", func(t *testing.T) {
		e := newEnv(t, nil)
		e.mount(cl(1), "a", 1<<20)
		for i := range 16 {
			e.put(cl(1), "k"+string(rune('a'+i)), obj, ReplicateConfig{HardPin: true})
		}
		e.m.Tick()
		e.m.Tick()
		if n := e.m.Stats().EvictionRuns; n != 1 {
			t.Fatalf("%d rounds", n)
		}
		e.clk.Advance(2 * time.Second)
		e.m.Tick()
		if n := e.m.Stats().EvictionRuns; n != 2 {
			t.Fatalf("%d rounds after the backoff", n)
		}
	})
}

func TestPlacement(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Strategy = alloc.Random })
	a, b := cl(1), cl(2)
	segs := map[string]alloc.Segment{}
	for _, n := range []string{"a1", "a2"} {
		segs[n] = e.mount(a, n, seg1M)
	}
	for _, n := range []string{"b1", "b2"} {
		segs[n] = e.mount(b, n, seg1M)
	}
	names := func(rs []Replica) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.SegmentName)
		}
		return out
	}
	for i, tc := range []struct {
		name  string
		rc    ReplicateConfig
		check func([]string) bool
	}{
		{"distinct segments", ReplicateConfig{Replicas: 4}, func(n []string) bool {
			return len(n) == 4 && len(sortedSet(n)) == 4
		}},
		{"best effort", ReplicateConfig{Replicas: 9}, func(n []string) bool { return len(n) == 4 }},
		{"preferred first", ReplicateConfig{Replicas: 2, Preferred: []string{"b2", "a1"}}, func(n []string) bool {
			return slices.Equal(n, []string{"b2", "a1"})
		}},
		{"preferred then others", ReplicateConfig{Replicas: 3, Preferred: []string{"b2"}}, func(n []string) bool {
			return len(n) == 3 && n[0] == "b2" && len(sortedSet(n)) == 3
		}},
		{"same node", ReplicateConfig{Replicas: 2, SameNode: true}, func(n []string) bool {
			return slices.Equal(sortedSet(n), []string{"b1", "b2"})
		}},
	} {
		key := "k" + string(rune('0'+i))
		reps := e.put(b, key, 1000, tc.rc)
		if !tc.check(names(reps)) {
			t.Errorf("%s: replicas on %v", tc.name, names(reps))
		}
		got, _, err := e.m.GetReplicaList(key)
		if err != nil || len(got) != len(reps) {
			t.Errorf("%s: get %v %v", tc.name, got, err)
		}
	}
	checkInvariants(t, e.m)
}

func sortedSet(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

func TestLiveness(t *testing.T) {
	e := newEnv(t, nil)
	a, b, pure := cl(1), cl(2), cl(3)
	sa := e.mount(a, "a", seg1M)
	e.mount(b, "b", seg1M)
	e.put(pure, "only-a", 1000, ReplicateConfig{Preferred: []string{"a"}})
	e.put(pure, "both", 1000, ReplicateConfig{Replicas: 2})
	e.put(pure, "only-b", 1000, ReplicateConfig{Preferred: []string{"b"}})
	if _, err := e.m.PutStart(pure, "pending-a", 1000, ReplicateConfig{Preferred: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	if _, st := e.m.Ping(pure); st != ClientNeedRemount {
		t.Fatal("a pure client is tracked")
	}
	// b keeps pinging, a falls silent.
	for range 11 {
		e.clk.Advance(time.Second)
		if _, st := e.m.Ping(b); st != ClientOK {
			t.Fatal("live client told to remount")
		}
		e.m.Tick()
	}
	if _, err := e.m.QuerySegmentStatus(sa.ID); !errors.Is(err, errcode.ErrSegmentNotFound) {
		t.Fatalf("segment of the dead client: %v", err)
	}
	if e.exists("only-a") || e.exists("pending-a") {
		t.Fatal("objects whose only replica was on the dead client survive")
	}
	reps, _, err := e.m.GetReplicaList("both")
	if err != nil || len(reps) != 1 || reps[0].SegmentName != "b" {
		t.Fatalf("surviving object: %v %v", reps, err)
	}
	if !e.exists("only-b") {
		t.Fatal("object on the live client lost")
	}
	st := e.m.Stats()
	if st.ExpiredClients != 1 || st.ActiveClients != 1 || st.LostKeys != 2 || st.DroppedReplicas != 3 || st.Segments != 1 {
		t.Fatalf("stats %+v", st)
	}
	var lost []string
	for _, ev := range e.ev.take() {
		if ev.Kind == EventRemoved {
			if ev.Reason != ReasonLost {
				t.Fatalf("event %+v", ev)
			}
			lost = append(lost, ev.Key)
		}
	}
	if !slices.Equal(lost, []string{"only-a"}) { // an unfinished put was never announced
		t.Fatalf("removed events %v", lost)
	}
	// The client comes back: told to remount, and remounting restores
	// service.
	view, status := e.m.Ping(a)
	if status != ClientNeedRemount || view != e.m.ViewVersion() {
		t.Fatalf("Ping = %d, %v", view, status)
	}
	if err := e.m.ReMountSegment(a, []alloc.Segment{sa}); err != nil {
		t.Fatal(err)
	}
	if _, st := e.m.Ping(a); st != ClientOK {
		t.Fatal("remounted client still told to remount")
	}
	if err := e.m.ReMountSegment(a, []alloc.Segment{sa}); err != nil {
		t.Fatalf("remount is not idempotent: %v", err)
	}
	reps = e.put(a, "again", 1000, ReplicateConfig{Preferred: []string{"a"}})
	if reps[0].SegmentName != "a" {
		t.Fatalf("put after remount on %v", reps)
	}
	checkInvariants(t, e.m)
}

func TestUnmountSegment(t *testing.T) {
	e := newEnv(t, nil)
	a := cl(1)
	s1 := e.mount(a, "a", seg1M)
	e.mount(a, "a", seg1M) // same engine segment name, second pool segment
	e.put(a, "k1", 1000, ReplicateConfig{Replicas: 2})
	e.put(a, "k2", 1000, ReplicateConfig{})
	if err := e.m.UnmountSegment(a, s1.ID); err != nil {
		t.Fatal(err)
	}
	reps, _, err := e.m.GetReplicaList("k1")
	if err != nil || len(reps) != 1 || reps[0].SegmentID == s1.ID {
		t.Fatalf("k1 %v %v", reps, err)
	}
	if segs := e.m.AllSegments(); len(segs) != 1 || segs[0].ID == s1.ID {
		t.Fatalf("segments %+v", segs)
	}
	if _, st := e.m.Ping(a); st != ClientOK {
		t.Fatal("a client with segments left must stay tracked")
	}
	checkInvariants(t, e.m)
}

func TestDiscardAndRelease(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ClientTTL = 24 * time.Hour })
	a, b := cl(1), cl(2)
	e.mount(a, "a", seg1M)
	old, err := e.m.PutStart(a, "k", 1000, ReplicateConfig{})
	if err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(30*time.Second - time.Nanosecond)
	_, err = e.m.PutStart(b, "k", 1000, ReplicateConfig{})
	wantErr(t, "PutStart before the discard timeout", err, errcode.ErrObjectAlreadyExists)
	e.clk.Advance(time.Nanosecond)
	fresh, err := e.m.PutStart(b, "k", 1000, ReplicateConfig{})
	if err != nil {
		t.Fatalf("takeover: %v", err)
	}
	if fresh[0].Addr == old[0].Addr {
		t.Fatal("the new put reuses the old writer's buffer")
	}
	st := e.m.Stats()
	if st.DiscardedPuts != 1 || st.Quarantined != 1 || st.Allocated != 2*alloc.Reserved(1000) {
		t.Fatalf("stats %+v", st)
	}
	wantErr(t, "PutEnd by the old writer", e.m.PutEnd(a, "k", Memory, nil), errcode.ErrIllegalClient)
	wantErr(t, "PutEnd by the new writer", e.m.PutEnd(b, "k", Memory, nil), nil)
	checkInvariants(t, e.m)
	// The old buffer is freed at its put's release time: start + 600s.
	e.clk.Advance(570*time.Second - time.Nanosecond)
	e.m.Tick()
	if e.m.Stats().Quarantined != 1 {
		t.Fatal("quarantine freed early")
	}
	e.clk.Advance(time.Nanosecond)
	e.m.Tick()
	if st := e.m.Stats(); st.Quarantined != 0 || st.Allocated != alloc.Reserved(1000) {
		t.Fatalf("after release: %+v", st)
	}
	checkInvariants(t, e.m)

	// A put nobody finishes is released at PutReleaseTimeout.
	if _, err := e.m.PutStart(a, "stale", 1000, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(600*time.Second - time.Nanosecond)
	e.m.Tick()
	if _, err := e.m.QueryKey("stale"); err != nil {
		t.Fatalf("released early: %v", err)
	}
	e.clk.Advance(time.Nanosecond)
	e.m.Tick()
	if _, err := e.m.QueryKey("stale"); !errors.Is(err, errcode.ErrObjectNotFound) {
		t.Fatalf("not released: %v", err)
	}
	if st := e.m.Stats(); st.ReleasedPuts != 1 || st.PendingKeys != 0 || st.Allocated != alloc.Reserved(1000) {
		t.Fatalf("stats %+v", st)
	}
	wantErr(t, "PutEnd after release", e.m.PutEnd(a, "stale", Memory, nil), errcode.ErrObjectNotFound)

	// A forced Remove of an unfinished put quarantines too.
	if _, err := e.m.PutStart(a, "forced", 1000, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Remove("forced", true); err != nil {
		t.Fatal(err)
	}
	if st := e.m.Stats(); st.Quarantined != 1 || st.Keys != 1 {
		t.Fatalf("stats %+v", st)
	}
	checkInvariants(t, e.m)
}

func TestBatch(t *testing.T) {
	e := newEnv(t, nil)
	a, b := cl(1), cl(2)
	e.mount(a, "a", 1<<20)
	e.put(a, "exists", 100, ReplicateConfig{})
	keys := []string{"x", "", "exists", "y", "big"}
	res, err := e.m.BatchPutStart(a, keys, []uint64{100, 100, 100, 0, 4 << 20}, ReplicateConfig{})
	if err != nil {
		t.Fatal(err)
	}
	want := []error{nil, errcode.ErrInvalidKey, errcode.ErrObjectAlreadyExists, errcode.ErrInvalidParams, errcode.ErrNoAvailableHandle}
	for i, r := range res {
		wantErr(t, "BatchPutStart "+keys[i], r.Err, want[i])
		if (r.Err == nil) != (len(r.Replicas) == 1) {
			t.Fatalf("item %d: %+v", i, r)
		}
	}
	errs, err := e.m.BatchPutEnd(a, []string{"x", "missing", "exists"}, Memory, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range []error{nil, errcode.ErrObjectNotFound, nil} {
		wantErr(t, "BatchPutEnd", errs[i], w)
	}
	if _, err := e.m.PutStart(a, "p1", 100, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	for i, err := range e.m.BatchPutRevoke(b, []string{"p1", "x"}, Memory) {
		wantErr(t, "BatchPutRevoke", err, []error{errcode.ErrIllegalClient, errcode.ErrInvalidWrite}[i])
	}
	gets := e.m.BatchGetReplicaList([]string{"x", "p1", "nope"})
	for i, w := range []error{nil, errcode.ErrReplicaIsNotReady, errcode.ErrObjectNotFound} {
		wantErr(t, "BatchGetReplicaList", gets[i].Err, w)
	}
	if len(gets[0].Replicas) != 1 || gets[0].LeaseTTL != 10*time.Second {
		t.Fatalf("get %+v", gets[0])
	}
	ok, errs := e.m.BatchExistKey([]string{"x", "p1", "nope", ""}, true)
	if !slices.Equal(ok, []bool{true, false, false, false}) {
		t.Fatalf("exist %v", ok)
	}
	wantErr(t, "BatchExistKey empty key", errs[3], errcode.ErrInvalidKey)
	for i, err := range e.m.BatchRemove([]string{"x", "exists", "p1", "nope"}, false) {
		wantErr(t, "BatchRemove", err, []error{errcode.ErrObjectHasLease, nil, errcode.ErrObjectReplicaBusy, errcode.ErrObjectNotFound}[i])
	}
	// Invalid config fails every item.
	res, err = e.m.BatchPutStart(a, []string{"q", "r"}, []uint64{1, 1}, ReplicateConfig{Replicas: 99})
	if err != nil || !errors.Is(res[0].Err, errcode.ErrInvalidParams) || !errors.Is(res[1].Err, errcode.ErrInvalidParams) {
		t.Fatalf("bad config: %v %+v", err, res)
	}
	checkInvariants(t, e.m)
}

func TestRemoveByRegex(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "a", 1<<20)
	for _, k := range []string{"model/a/1", "model/a/2", "model/b/1", "xmodel/a/3", "model/a/leased"} {
		e.put(cl(1), k, 100, ReplicateConfig{})
	}
	if _, err := e.m.PutStart(cl(1), "model/a/pending", 100, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	e.m.GetReplicaList("model/a/leased")
	n, err := e.m.RemoveByRegex(`model/a/.*`, false)
	if err != nil || n != 2 {
		t.Fatalf("removed %d, %v", n, err)
	}
	for k, want := range map[string]bool{"model/a/1": false, "model/a/2": false, "model/b/1": true, "xmodel/a/3": true, "model/a/leased": true} {
		if e.exists(k) != want {
			t.Errorf("%s exists %v", k, !want)
		}
	}
	if n, err := e.m.RemoveByRegex(`model/a/.*`, true); err != nil || n != 1 {
		t.Fatalf("forced: %d %v", n, err)
	}
	if _, err := e.m.QueryKey("model/a/pending"); err != nil {
		t.Fatal("an unfinished put was removed by regex")
	}
	checkInvariants(t, e.m)
}

func TestEvents(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "a", 1<<20)
	block := &BlockMeta{BlockHashes: []uint64{7, 8}, HasParent: true, ParentHash: 6, TokenIDs: []uint32{1, 2}, BlockSize: 16}
	if _, err := e.m.PutStart(cl(1), "k", 100, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	if evs := e.ev.take(); len(evs) != 0 {
		t.Fatalf("PutStart emitted %v", evs)
	}
	if err := e.m.PutEnd(cl(1), "k", Memory, block); err != nil {
		t.Fatal(err)
	}
	evs := e.ev.take()
	if len(evs) != 1 || evs[0].Kind != EventStored || evs[0].Key != "k" || evs[0].Block != block || len(evs[0].Replicas) != 1 || evs[0].Size != 100 {
		t.Fatalf("stored %+v", evs)
	}
	if err := e.m.Remove("k", false); err != nil {
		t.Fatal(err)
	}
	evs = e.ev.take()
	if len(evs) != 1 || evs[0].Kind != EventRemoved || evs[0].Reason != ReasonRemoved || !slices.Equal(evs[0].Block.BlockHashes, []uint64{7, 8}) {
		t.Fatalf("removed %+v", evs)
	}
	// RemoveAll: one Cleared when nothing complete is left, else per key.
	e.put(cl(1), "x", 100, ReplicateConfig{})
	e.put(cl(1), "y", 100, ReplicateConfig{})
	e.ev.take()
	if n, _ := e.m.RemoveAll(false); n != 2 {
		t.Fatal(n)
	}
	if evs := e.ev.take(); len(evs) != 1 || evs[0].Kind != EventCleared {
		t.Fatalf("RemoveAll events %+v", evs)
	}
	e.put(cl(1), "x", 100, ReplicateConfig{})
	e.put(cl(1), "y", 100, ReplicateConfig{})
	e.m.GetReplicaList("y")
	e.ev.take()
	if n, _ := e.m.RemoveAll(false); n != 1 {
		t.Fatal(n)
	}
	if evs := e.ev.take(); len(evs) != 1 || evs[0].Kind != EventRemoved || evs[0].Key != "x" {
		t.Fatalf("partial RemoveAll events %+v", evs)
	}
	if n, _ := e.m.RemoveAll(true); n != 1 {
		t.Fatal("forced RemoveAll skipped a leased object")
	}
}

func TestStartClose(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.EvictInterval = time.Millisecond
		c.LivenessInterval = time.Millisecond
	})
	e.mount(cl(1), "a", 1<<20)
	for i := range 16 {
		e.put(cl(1), "k"+string(rune('a'+i)), 64<<10, ReplicateConfig{})
	}
	if err := e.m.Start(); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Start(); err != nil {
		t.Fatal(err)
	}
	// The loop evicts down below the watermark on its own.
	deadline := time.Now().Add(20 * time.Second)
	for e.m.Stats().EvictionRuns == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the eviction loop never ran")
		}
		time.Sleep(time.Millisecond)
	}
	// The liveness loop expires the silent client once the clock moves.
	e.clk.Advance(time.Minute)
	for e.m.Stats().ExpiredClients == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the liveness loop never ran")
		}
		time.Sleep(time.Millisecond)
	}
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
	checkInvariants(t, e.m)
}

// TestSlabCompaction fills one shard, removes most keys and checks the
// slab shrinks while every survivor stays intact.
func TestSlabCompaction(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Shards = 1 })
	e.mount(cl(1), "a", 1<<30)
	const n = 5000
	for i := range n {
		e.put(cl(1), "k"+strconv.Itoa(i), 100, ReplicateConfig{})
	}
	for i := range n {
		if i%10 != 0 {
			if err := e.m.Remove("k"+strconv.Itoa(i), false); err != nil {
				t.Fatal(err)
			}
		}
	}
	sh := &e.m.shards[0]
	// Free slots stay below max(1024, 3 * live) after every unlock.
	if free := sh.nslots - sh.len(); free > max(1024, 3*sh.len()) || sh.nslots >= n/2 {
		t.Fatalf("slab of %d slots for %d keys", sh.nslots, sh.len())
	}
	checkInvariants(t, e.m)
	for i := 0; i < n; i += 10 {
		if _, _, err := e.m.GetReplicaList("k" + strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := e.m.RemoveAll(true); n != 500 || sh.nslots != 0 {
		t.Fatalf("RemoveAll %d, slab %d", n, sh.nslots)
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Memory.String(), "MEMORY"}, {LocalDisk.String(), "LOCAL_DISK"}, {ReplicaType(9).String(), "ReplicaType(9)"},
		{StatusComplete.String(), "COMPLETE"}, {StatusProcessing.String(), "PROCESSING"},
		{ClientNeedRemount.String(), "NEED_REMOUNT"}, {SegmentUnmounting.String(), "UNMOUNTING"},
		{OpPutStart.String(), "PutStart"}, {OpClientExpired.String(), "ClientExpired"}, {OpKind(0).String(), "OpKind(0)"},
	} {
		if tc.got != tc.want {
			t.Errorf("%q, want %q", tc.got, tc.want)
		}
	}
}
