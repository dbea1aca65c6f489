package master

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

func (e *env) reserve(c UUID, size uint64, rc ReplicateConfig, n int) []Reservation {
	e.t.Helper()
	res := e.m.Reserve(c, ReserveSpec{Size: size, Config: rc, Count: n})
	if res.Err != nil || len(res.Reservations) != n {
		e.t.Fatalf("Reserve: %d of %d, %v", len(res.Reservations), n, res.Err)
	}
	return res.Reservations
}

func TestReserveCommit(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "a", 8<<20)
	e.mount(cl(2), "b", 8<<20)
	rs := e.reserve(cl(1), 1<<20, ReplicateConfig{Replicas: 2}, 3)
	st := e.m.Stats()
	if st.Reservations != 3 || st.ReservedBytes != 3<<20 || st.Keys != 0 || st.Allocated != 6<<20 {
		t.Fatalf("after Reserve: %+v", st)
	}
	for _, r := range rs {
		if len(r.Replicas) != 2 || r.Replicas[0].SegmentName == r.Replicas[1].SegmentName || r.Replicas[0].Status != StatusProcessing {
			t.Fatalf("reservation %+v", r)
		}
	}
	checkInvariants(t, e.m)
	e.ev.take()

	errs := e.m.Commit(cl(1), []CommitItem{
		{Key: "k1", ID: rs[0].ID, Block: &BlockMeta{BlockHashes: []uint64{7}}},
		{Key: "k2", ID: rs[1].ID},
		{Key: "k3", ID: 999},          // never given
		{Key: "k4", ID: rs[2].ID + 1}, // not yet given
	})
	wantErr(t, "commit k1", errs[0], nil)
	wantErr(t, "commit k2", errs[1], nil)
	wantErr(t, "unknown id", errs[2], errcode.ErrReplicaIsGone)
	wantErr(t, "unknown id", errs[3], errcode.ErrReplicaIsGone)
	reps, _, err := e.m.GetReplicaList("k1")
	if err != nil || len(reps) != 2 || reps[0].Addr != rs[0].Replicas[0].Addr || reps[1].Addr != rs[0].Replicas[1].Addr || reps[0].Status != StatusComplete {
		t.Fatalf("k1 replicas %+v %v, reserved at %+v", reps, err, rs[0].Replicas)
	}
	if evs := e.ev.take(); len(evs) != 2 || evs[0].Kind != EventStored || evs[0].Key != "k1" || evs[0].Block.BlockHashes[0] != 7 {
		t.Fatalf("events %+v", evs)
	}
	// A committed reservation is gone: committing it again fails and
	// leaves the first key alone.
	wantErr(t, "commit twice", e.m.Commit(cl(1), []CommitItem{{Key: "k9", ID: rs[0].ID}})[0], errcode.ErrReplicaIsGone)
	st = e.m.Stats()
	if st.Reservations != 1 || st.ReservedBytes != 1<<20 || st.Keys != 2 || st.PendingKeys != 0 {
		t.Fatalf("after Commit: %+v", st)
	}
	checkInvariants(t, e.m)

	// Another client cannot use it; a taken key keeps the reservation.
	wantErr(t, "other client", e.m.Commit(cl(2), []CommitItem{{Key: "k5", ID: rs[2].ID}})[0], errcode.ErrIllegalClient)
	wantErr(t, "taken key", e.m.Commit(cl(1), []CommitItem{{Key: "k1", ID: rs[2].ID}})[0], errcode.ErrObjectAlreadyExists)
	if _, err := e.m.PutStart(cl(2), "pending", 10, ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "young unfinished put", e.m.Commit(cl(1), []CommitItem{{Key: "pending", ID: rs[2].ID}})[0], errcode.ErrObjectAlreadyExists)
	wantErr(t, "bad key", e.m.Commit(cl(1), []CommitItem{{Key: "", ID: rs[2].ID}})[0], errcode.ErrInvalidKey)
	wantErr(t, "still usable", e.m.Commit(cl(1), []CommitItem{{Key: "k5", ID: rs[2].ID}})[0], nil)
	if e.m.Stats().Reservations != 0 {
		t.Fatal("reservation left")
	}
	checkInvariants(t, e.m)
}

func TestReserveValidation(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "a", 4<<20)
	for _, c := range []struct {
		name string
		c    UUID
		spec ReserveSpec
		want error
	}{
		{"zero client", UUID{}, ReserveSpec{Size: 1, Count: 1}, errcode.ErrInvalidParams},
		{"size 0", cl(1), ReserveSpec{Size: 0, Count: 1}, errcode.ErrInvalidParams},
		{"count 0", cl(1), ReserveSpec{Size: 1, Count: 0}, errcode.ErrInvalidParams},
		{"count too big", cl(1), ReserveSpec{Size: 1, Count: MaxReserveCount + 1}, errcode.ErrInvalidParams},
		{"bad config", cl(1), ReserveSpec{Size: 1, Count: 1, Config: ReplicateConfig{SoftPin: true, HardPin: true}}, errcode.ErrInvalidParams},
		{"no room", cl(1), ReserveSpec{Size: 8 << 20, Count: 1}, errcode.ErrNoAvailableHandle},
	} {
		res := e.m.Reserve(c.c, c.spec)
		wantErr(t, c.name, res.Err, c.want)
		if len(res.Reservations) != 0 {
			t.Fatalf("%s: placed %d", c.name, len(res.Reservations))
		}
	}
	// Partly placed: as many as fit, no error.
	res := e.m.Reserve(cl(1), ReserveSpec{Size: 1 << 20, Count: 6})
	if res.Err != nil || len(res.Reservations) != 4 {
		t.Fatalf("partial: %d %v", len(res.Reservations), res.Err)
	}
	checkInvariants(t, e.m)
}

// TestReserveNeverEvicts: a full pool refuses reservations rather than
// evicting data for them.
func TestReserveNeverEvicts(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "a", 4<<20)
	for i := range 4 {
		e.put(cl(1), string(rune('a'+i)), 1<<20, ReplicateConfig{})
	}
	res := e.m.Reserve(cl(1), ReserveSpec{Size: 1 << 20, Count: 1})
	wantErr(t, "full", res.Err, errcode.ErrNoAvailableHandle)
	if st := e.m.Stats(); st.Keys != 4 || st.EvictedKeys != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestReserveTimeouts(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PutDiscardTimeout, c.PutReleaseTimeout = 10*time.Second, 60*time.Second })
	e.mount(cl(1), "a", 8<<20)
	rs := e.reserve(cl(1), 1<<20, ReplicateConfig{}, 2)
	e.clk.Advance(9 * time.Second)
	e.m.Ping(cl(1))
	wantErr(t, "young", e.m.Commit(cl(1), []CommitItem{{Key: "k1", ID: rs[0].ID}})[0], nil)
	e.clk.Advance(time.Second)
	wantErr(t, "past the discard timeout", e.m.Commit(cl(1), []CommitItem{{Key: "k2", ID: rs[1].ID}})[0], errcode.ErrReplicaIsGone)
	e.m.Tick()
	if st := e.m.Stats(); st.Reservations != 1 {
		t.Fatalf("freed before the release timeout: %+v", st)
	}
	for range 10 { // the segment's client stays alive
		e.clk.Advance(5 * time.Second)
		e.m.Ping(cl(1))
	}
	e.m.Tick()
	if st := e.m.Stats(); st.Reservations != 0 || st.Allocated != 1<<20 || st.ReleasedPuts != 1 {
		t.Fatalf("after the release timeout: %+v", st)
	}
	checkInvariants(t, e.m)
}

func TestUnreserve(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "a", 8<<20)
	rs := e.reserve(cl(1), 1<<20, ReplicateConfig{}, 3)
	if n := e.m.Unreserve(cl(2), []uint64{rs[0].ID}); n != 0 {
		t.Fatalf("another client gave back %d", n)
	}
	if n := e.m.Unreserve(cl(1), []uint64{rs[0].ID, rs[1].ID, 12345, rs[0].ID}); n != 2 {
		t.Fatalf("gave back %d", n)
	}
	if st := e.m.Stats(); st.Reservations != 1 || st.Allocated != 1<<20 {
		t.Fatalf("after Unreserve: %+v", st)
	}
	wantErr(t, "given back", e.m.Commit(cl(1), []CommitItem{{Key: "k", ID: rs[0].ID}})[0], errcode.ErrReplicaIsGone)
	checkInvariants(t, e.m)
}

// TestReserveUnmount: a reservation loses its replica on an unmounted
// segment and keeps the others; one left with none is gone.
func TestReserveUnmount(t *testing.T) {
	e := newEnv(t, nil)
	a := e.mount(cl(1), "a", 8<<20)
	e.mount(cl(2), "b", 8<<20)
	two := e.reserve(cl(3), 1<<20, ReplicateConfig{Replicas: 2}, 1)[0]
	one := e.reserve(cl(3), 1<<20, ReplicateConfig{Preferred: []string{"a"}}, 1)[0]
	if one.Replicas[0].SegmentName != "a" {
		t.Fatalf("preferred segment ignored: %+v", one)
	}
	if err := e.m.UnmountSegment(cl(1), a.ID); err != nil {
		t.Fatal(err)
	}
	if st := e.m.Stats(); st.Reservations != 1 || st.UnmountedReplicas != 2 || st.DroppedReplicas != 0 { // a clean unmount loses nothing
		t.Fatalf("after unmount: %+v", st)
	}
	wantErr(t, "lost", e.m.Commit(cl(3), []CommitItem{{Key: "k1", ID: one.ID}})[0], errcode.ErrReplicaIsGone)
	wantErr(t, "kept one replica", e.m.Commit(cl(3), []CommitItem{{Key: "k2", ID: two.ID}})[0], nil)
	reps, _, err := e.m.GetReplicaList("k2")
	if err != nil || len(reps) != 1 || reps[0].SegmentName != "b" {
		t.Fatalf("k2: %+v %v", reps, err)
	}
	checkInvariants(t, e.m)
}

// TestReservePins: pins given at Reserve apply once committed.
func TestReservePins(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "a", 8<<20)
	hard := e.reserve(cl(1), 1<<20, ReplicateConfig{HardPin: true}, 1)[0]
	soft := e.reserve(cl(1), 1<<20, ReplicateConfig{SoftPin: true, SoftPinTTL: time.Minute}, 1)[0]
	if st := e.m.Stats(); st.HardPinnedKeys != 0 || st.SoftPinnedKeys != 0 {
		t.Fatalf("pins counted before commit: %+v", st)
	}
	for _, err := range e.m.Commit(cl(1), []CommitItem{{Key: "h", ID: hard.ID}, {Key: "s", ID: soft.ID}}) {
		wantErr(t, "commit", err, nil)
	}
	info, err := e.m.QueryKey("s")
	if err != nil || !info.SoftPin || !info.SoftPinDeadline.Equal(t0.Add(time.Minute)) {
		t.Fatalf("soft: %+v %v", info, err)
	}
	if info, _ := e.m.QueryKey("h"); !info.HardPin {
		t.Fatalf("hard: %+v", info)
	}
	if st := e.m.Stats(); st.HardPinnedKeys != 1 || st.SoftPinnedKeys != 1 {
		t.Fatalf("pins: %+v", st)
	}
	checkInvariants(t, e.m)
}

// A Commit landing while an unmount is under way must not leave a key
// with a replica on the released segment: the next mount reuses its
// index, and evicting the key would free a range of another client's
// segment (and a standby replaying the log diverged).
func TestCommitDuringUnmount(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "a", 8<<20)
	b := e.mount(cl(2), "b", 8<<20)
	e.put(cl(2), "on-b", 1<<20, ReplicateConfig{Replicas: 2})
	rs := e.reserve(cl(1), 1<<20, ReplicateConfig{Replicas: 2}, 1)
	require.Len(t, rs[0].Replicas, 2)
	var commitErr error
	e.m.unmountHook = func() {
		commitErr = e.m.Commit(cl(1), []CommitItem{{Key: "k", ID: rs[0].ID}})[0]
	}
	require.NoError(t, e.m.UnmountSegment(cl(2), b.ID))
	e.m.unmountHook = nil
	require.NoError(t, commitErr)
	reps, _, err := e.m.GetReplicaList("k")
	require.NoError(t, err)
	for _, r := range reps {
		assert.NotEqual(t, "b", r.SegmentName, "k kept a replica on the unmounted segment")
	}
	checkInvariants(t, e.m)
	// The log replays on a standby, through a remount that reuses the
	// index and an eviction of k.
	e.mount(cl(3), "c", 8<<20)
	require.NoError(t, e.m.Remove("k", true))
	standby, err := New(Config{Shards: 3, Clock: e.clk, Seed: 99})
	require.NoError(t, err)
	defer standby.Close()
	for i, op := range e.log.all() {
		require.NoError(t, standby.Replay(op), "op %d %v %q", i, op.Kind, op.Key)
	}
	assert.Empty(t, diffState(dumpState(e.m), dumpState(standby)))
}

// Reserve reads the new reservation's replicas while an unmount drops
// its replica on the segment going away (run with -race).
func TestReserveRacesUnmount(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "a", 64<<20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 300 {
			s := alloc.Segment{ID: UUID{Hi: 0xbb, Lo: uint64(i + 1)}, Name: "b", Base: 1 << 50, Size: 64 << 20, Protocol: "tcp"}
			if err := e.m.MountSegment(cl(2), s); err != nil {
				t.Error(err)
				return
			}
			if err := e.m.UnmountSegment(cl(2), s.ID); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for {
		select {
		case <-done:
			checkInvariants(t, e.m)
			return
		default:
		}
		res := e.m.Reserve(cl(1), ReserveSpec{Size: 4096, Config: ReplicateConfig{Replicas: 2}, Count: 4})
		require.NoError(t, res.Err)
		for _, r := range res.Reservations {
			for _, rep := range r.Replicas {
				assert.NotEmpty(t, rep.SegmentName)
			}
		}
		var ids []uint64
		for _, r := range res.Reservations {
			ids = append(ids, r.ID)
		}
		e.m.Unreserve(cl(1), ids)
	}
}

// TestReserveTables: reservations live in their owner's table; another
// client's, in the same table or another, is refused and not given back;
// the release and unmount walks, which log no client, cover every table,
// and a standby replaying the log ends in the same state.
func TestReserveTables(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.PutDiscardTimeout, c.PutReleaseTimeout = 10*time.Second, 60*time.Second })
	owner := cl(1)
	var same, other UUID
	for i := uint64(2); same.IsZero() || other.IsZero(); i++ {
		if c := cl(i); e.m.resvOf(c) == e.m.resvOf(owner) {
			same = c
		} else {
			other = c
		}
	}
	var clients []UUID
	for i := range uint64(8) {
		clients = append(clients, cl(100+i))
	}
	e.mount(owner, "a", 64<<20)
	b := e.mount(other, "b", 64<<20)
	rs := e.reserve(owner, 1<<20, ReplicateConfig{}, 2)
	for _, c := range []UUID{same, other} {
		wantErr(t, "another client's", e.m.Commit(c, []CommitItem{{Key: "k", ID: rs[0].ID}})[0], errcode.ErrIllegalClient)
		require.Zero(t, e.m.Unreserve(c, []uint64{rs[0].ID, rs[1].ID}))
	}
	require.Equal(t, 1, e.m.Unreserve(owner, []uint64{rs[1].ID}))
	wantErr(t, "owner", e.m.Commit(owner, []CommitItem{{Key: "k", ID: rs[0].ID}})[0], nil)
	// Reservations in many tables, then a release and an unmount.
	for _, c := range clients {
		e.reserve(c, 1<<20, ReplicateConfig{}, 2)
	}
	require.Equal(t, 16, e.m.Stats().Reservations)
	require.NoError(t, e.m.UnmountSegment(other, b.ID))
	for range 13 {
		e.clk.Advance(5 * time.Second)
		e.m.Ping(owner)
	}
	e.m.Tick()
	require.Zero(t, e.m.Stats().Reservations)
	checkInvariants(t, e.m)

	standby, err := New(Config{Clock: e.clk})
	require.NoError(t, err)
	for _, op := range e.log.all() {
		require.NoError(t, standby.Replay(op), "%v", op.Kind)
	}
	checkInvariants(t, standby)
	var leader, follower strings.Builder
	require.NoError(t, e.m.DumpState(&leader))
	require.NoError(t, standby.DumpState(&follower))
	require.Equal(t, leader.String(), follower.String())
}
