package master

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// drive runs a random mix of every kind of operation against e's master:
// puts (some never finished, some revoked, some taken over), gets and
// probes, removes of all kinds, eviction under pressure, mounts,
// unmounts, client expiry and remounts, stale-put release, with the fake
// clock moving.
// checkpoint, when not nil, runs after every 500 steps.
func drive(t testing.TB, e *env, seed uint64, steps int, checkpoint func()) {
	r := rand.New(rand.NewPCG(seed, seed+1))
	clients := []UUID{cl(1), cl(2), cl(3), cl(4)}
	segsOf := map[UUID][]alloc.Segment{}
	alive := map[UUID]bool{}
	mount := func(c UUID) {
		s := e.mount(c, fmt.Sprintf("host%d", c.Lo), uint64(256+r.IntN(768))<<10)
		segsOf[c] = append(segsOf[c], s)
		alive[c] = true
	}
	for _, c := range clients[:3] {
		mount(c)
	}
	key := func() string { return fmt.Sprintf("k%03d", r.IntN(300)) }
	var pending []struct {
		c   UUID
		k   string
		gen uint64
	}
	config := func() ReplicateConfig {
		rc := ReplicateConfig{Replicas: 1 + r.IntN(3)}
		switch r.IntN(10) {
		case 0:
			rc.SoftPin = true
			if r.IntN(2) == 0 {
				rc.SoftPinTTL = time.Duration(1+r.IntN(60)) * time.Second
			}
		case 1:
			rc.HardPin = true
		case 2:
			rc.Preferred = []string{fmt.Sprintf("host%d", 1+r.IntN(4))}
		}
		return rc
	}
	type held struct {
		c  UUID
		id uint64
	}
	var resv []held
	for step := range steps {
		if checkpoint != nil && step%500 == 0 {
			checkpoint()
		}
		c := clients[r.IntN(len(clients))]
		if r.IntN(100) < 12 {
			// Put-ahead: reserve, commit (sometimes to a taken key, by
			// the wrong client or stale), give back.
			switch x := r.IntN(5); {
			case x < 2:
				res := e.m.Reserve(c, ReserveSpec{Size: uint64(1 + r.IntN(16<<10)), Config: config(), Count: 1 + r.IntN(3)})
				for _, rv := range res.Reservations {
					resv = append(resv, held{c, rv.ID})
				}
			case x < 4 && len(resv) > 0:
				i := r.IntN(len(resv))
				h := resv[i]
				by := h.c
				if r.IntN(10) == 0 {
					by = clients[r.IntN(len(clients))]
				}
				err := e.m.Commit(by, []CommitItem{{Key: key(), ID: h.id, Block: &BlockMeta{BlockHashes: []uint64{r.Uint64()}}}})[0]
				if err == nil || errors.Is(err, errcode.ErrReplicaIsGone) {
					resv = slices.Delete(resv, i, i+1)
				}
			case len(resv) > 0:
				i := r.IntN(len(resv))
				e.m.Unreserve(resv[i].c, []uint64{resv[i].id})
				resv = slices.Delete(resv, i, i+1)
			}
			continue
		}
		switch n := r.IntN(100); {
		case n < 25:
			rc := config()
			k := key()
			if _, gen, err := e.m.PutStartGen(c, k, uint64(1+r.IntN(16<<10)), rc); err == nil {
				pending = append(pending, struct {
					c   UUID
					k   string
					gen uint64
				}{c, k, gen})
			}
		case n < 50:
			if len(pending) > 0 {
				i := r.IntN(len(pending))
				p := pending[i]
				pending = slices.Delete(pending, i, i+1)
				gen := p.gen
				switch r.IntN(6) {
				case 0:
					gen = 0 // a reference client: not checked
				case 1:
					gen = p.gen + 1 // another put's, or none
				}
				if r.IntN(8) == 0 {
					e.m.PutRevokeGen(p.c, p.k, gen, Memory)
				} else if r.IntN(10) != 0 { // some are never finished
					e.m.PutEndGen(p.c, p.k, gen, Memory, &BlockMeta{BlockHashes: []uint64{r.Uint64()}})
				}
			}
		case n < 60:
			e.m.GetReplicaList(key())
		case n < 65:
			e.m.ExistKey(key(), r.IntN(2) == 0)
		case n < 72:
			e.m.Remove(key(), r.IntN(3) == 0)
		case n < 73:
			e.m.BatchRemove([]string{key(), key()}, false)
		case n < 74:
			e.m.RemoveByRegex(fmt.Sprintf("k%d.*", r.IntN(3)), r.IntN(2) == 0)
		case n < 75:
			if r.IntN(4) == 0 {
				e.m.RemoveAll(r.IntN(2) == 0)
			}
		case n < 78:
			e.m.Evict()
		case n < 80:
			if len(segsOf[c]) < 3 {
				mount(c)
			}
		case n < 82:
			if ss := segsOf[c]; len(ss) > 0 {
				i := r.IntN(len(ss))
				if err := e.m.UnmountSegment(c, ss[i].ID); err == nil {
					segsOf[c] = slices.Delete(ss, i, i+1)
				}
			}
		case n < 84:
			// A client falls silent now and then, and comes back.
			if !alive[c] || r.IntN(4) == 0 {
				alive[c] = !alive[c]
			}
		case n < 86:
			if _, st := e.m.Ping(c); st == ClientNeedRemount && alive[c] {
				var keep []alloc.Segment
				for _, s := range segsOf[c] {
					if _, err := e.m.QuerySegmentStatus(s.ID); err != nil {
						s.ID.Lo += 1000 // the client's memory comes back as a new segment
					}
					keep = append(keep, s)
				}
				if err := e.m.ReMountSegment(c, keep); err != nil {
					t.Fatalf("remount: %v", err)
				}
				segsOf[c] = keep
			}
		default:
			e.clk.Advance(time.Duration(r.IntN(3000)) * time.Millisecond)
			if r.IntN(40) == 0 {
				e.clk.Advance(time.Duration(r.IntN(700)) * time.Second) // past discard/release timeouts
			}
			for _, c := range clients {
				if alive[c] {
					e.m.Ping(c)
				}
			}
			e.m.Tick()
		}
	}
}

func TestOpLogReplay(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			e := newEnv(t, nil)
			type snap struct {
				n int
				s state
			}
			var snaps []snap
			maxKeys := int64(0)
			drive(t, e, seed, 6000, func() {
				snaps = append(snaps, snap{len(e.log.all()), dumpState(e.m)})
				maxKeys = max(maxKeys, e.m.Stats().Keys)
			})
			checkInvariants(t, e.m)
			ops := e.log.all()
			snaps = append(snaps, snap{len(ops), dumpState(e.m)})
			kinds := map[OpKind]int{}
			for _, op := range ops {
				kinds[op.Kind]++
			}
			for k := OpPutStart; k <= OpClientLeft; k++ {
				if kinds[k] == 0 {
					t.Errorf("the mix never produced %v (%v)", k, kinds)
				}
			}
			// A standby with another shard count replays the log; its state
			// matches the master's at every checkpoint.
			standby, err := New(Config{Shards: 3, Clock: e.clk, Seed: 99})
			if err != nil {
				t.Fatal(err)
			}
			done := 0
			for _, sn := range snaps {
				for ; done < sn.n; done++ {
					op := ops[done]
					if err := standby.Replay(op); err != nil {
						t.Fatalf("op %d (%v %q): %v", done, op.Kind, op.Key, err)
					}
				}
				if d := diffState(sn.s, dumpState(standby)); d != "" {
					t.Fatalf("after %d ops the replayed state differs:\n%s", sn.n, d)
				}
			}
			checkInvariants(t, standby)
			// A promoted standby numbers puts after every logged one.
			var maxGen uint64
			for _, op := range ops {
				if op.Kind == OpPutStart {
					if op.Gen == 0 {
						t.Fatalf("PutStart of %q logged without a generation", op.Key)
					}
					maxGen = max(maxGen, op.Gen)
				}
			}
			if g := standby.nextGen(); g <= maxGen {
				t.Fatalf("standby's next generation %d, logged up to %d", g, maxGen)
			}
			a, b := e.m.Stats(), standby.Stats()
			if a.Keys != b.Keys || a.Allocated != b.Allocated || a.Capacity != b.Capacity || a.PendingKeys != b.PendingKeys ||
				a.SoftPinnedKeys != b.SoftPinnedKeys || a.HardPinnedKeys != b.HardPinnedKeys || a.ActiveClients != b.ActiveClients {
				t.Fatalf("stats differ:\n%+v\n%+v", a, b)
			}
			t.Logf("%d ops: %v; %d checkpoints, up to %d keys", len(ops), kinds, len(snaps), maxKeys)
		})
	}
}

// TestReplayDetectsDivergence replays a log whose addresses were altered,
// and ops that cannot apply.
func TestReplayDetectsDivergence(t *testing.T) {
	e := newEnv(t, nil)
	drive(t, e, 7, 600, nil)
	ops := e.log.all()
	idx := slices.IndexFunc(ops, func(op *Op) bool { return op.Kind == OpPutStart && len(ops) > 0 })
	for i := idx + 1; i < len(ops); i++ {
		// Pick a PutStart after a few allocations on its segment.
		if ops[i].Kind == OpPutStart && i > len(ops)/4 {
			idx = i
			break
		}
	}
	standby, err := New(Config{Shards: 4, Clock: e.clk})
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ops[:idx] {
		if err := standby.Replay(op); err != nil {
			t.Fatal(err)
		}
	}
	before := dumpState(standby)
	bad := *ops[idx]
	bad.Addrs = slices.Clone(bad.Addrs)
	bad.Addrs[0] += alloc.Alignment
	if err := standby.Replay(&bad); !errors.Is(err, ErrReplayDiverged) {
		t.Fatalf("replay of a divergent address: %v", err)
	}
	if d := diffState(before, dumpState(standby)); d != "" {
		t.Fatalf("a diverged op changed state:\n%s", d)
	}
	// The true op's placement under a key that exists: live puts skip
	// this lookup (claimKey made it), replay must not.
	var existing string
	for _, op := range ops[:idx] {
		if ok, _ := standby.ExistKey(op.Key, true); op.Kind == OpPutStart && ok {
			existing = op.Key
			break
		}
	}
	if existing == "" {
		t.Fatal("no complete key before the chosen PutStart")
	}
	dup := *ops[idx]
	dup.Key = existing
	if err := standby.Replay(&dup); !errors.Is(err, ErrReplayDiverged) {
		t.Fatalf("replay of a PutStart of an existing key: %v", err)
	}
	if d := diffState(before, dumpState(standby)); d != "" {
		t.Fatalf("a diverged PutStart changed state:\n%s", d)
	}
	if err := standby.Replay(ops[idx]); err != nil {
		t.Fatalf("the true op after the bad one: %v", err)
	}
	for _, tc := range []struct {
		name string
		op   *Op
	}{
		{"nil", nil},
		{"unknown kind", &Op{Kind: 200}},
		{"PutEnd of a missing key", &Op{Kind: OpPutEnd, Key: "nope"}},
		{"Remove of a missing key", &Op{Kind: OpRemove, Key: "nope"}},
		{"DropReplica of a missing key", &Op{Kind: OpDropReplica, Key: "nope", Segments: []uint32{0}}},
		{"DiscardFree of nothing", &Op{Kind: OpDiscardFree, Key: "nope", Segments: []uint32{0}, Addrs: []uint64{0}}},
		{"Mount at another index", &Op{Kind: OpMount, Segment: &alloc.Segment{ID: UUID{Lo: 12345}, Name: "x", Size: 1 << 20, Client: cl(9)}, Segments: []uint32{999}}},
		{"Unmount of no segment", &Op{Kind: OpUnmount, Segments: []uint32{999}}},
		{"ClientExpired of an unknown client", &Op{Kind: OpClientExpired, Client: cl(999)}},
		{"PutStart with mismatched addresses", &Op{Kind: OpPutStart, Key: "new", Size: 1, Segments: []uint32{0}}},
	} {
		if err := standby.Replay(tc.op); !errors.Is(err, ErrReplayDiverged) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
