package oplog

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/ha/internal/vfs"
	"github.com/crescent-kv/crescent/ha/internal/vfs/errorfs"
	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/admin"
	"github.com/crescent-kv/crescent/store/master/service"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// holdFS holds every file Sync while held is set, until release.
type holdFS struct {
	vfs.FS
	mu      sync.Mutex
	held    bool
	entered chan struct{} // a Sync is being held (buffered 1)
	release chan struct{}
	once    sync.Once
}

func newHoldFS() *holdFS {
	return &holdFS{FS: vfs.Default, entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (h *holdFS) hold() { h.mu.Lock(); h.held = true; h.mu.Unlock() }

func (h *holdFS) unhold() {
	h.mu.Lock()
	h.held = false
	h.mu.Unlock()
	h.once.Do(func() { close(h.release) })
}

func (h *holdFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := h.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &holdFile{File: f, h: h}, nil
}

type holdFile struct {
	vfs.File
	h *holdFS
}

func (f *holdFile) Sync() error {
	f.h.mu.Lock()
	held := f.h.held
	f.h.mu.Unlock()
	if held {
		select {
		case f.h.entered <- struct{}{}:
		default:
		}
		<-f.h.release
	}
	return f.File.Sync()
}

// leakCheck checks for leaked goroutines after every cleanup (the
// servers') has run.
func leakCheck(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// serveDurable serves d's master on a real gRPC server on 127.0.0.1:0.
func serveDurable(t *testing.T, d *Durable) (storepb.MasterClient, *service.Service) {
	return serveDurableOver(t, d, false)
}

// serveDurableOver is serveDurable with a crpc client instead when crpc.
func serveDurableOver(t *testing.T, d *Durable, overCRPC bool) (storepb.MasterClient, *service.Service) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	svc := service.New(d.Master, d.ServiceOption())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	var conn interface {
		grpc.ClientConnInterface
		Close() error
	}
	if overCRPC {
		conn, err = crpc.Dial(ctx, lis.Addr().String())
	} else {
		conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	require.NoError(t, err)
	t.Cleanup(func() {
		conn.Close()
		cancel()
		assert.NoError(t, <-done)
	})
	return storepb.NewMasterClient(conn), svc
}

// openHeld opens a durable master whose log's fsync the test can hold,
// serves it and mounts durSeg. Cleanup releases the fsync first (a
// failing test must not leave it held), then stops the server, then
// closes the master.
func openHeld(t *testing.T) (*Durable, *holdFS, storepb.MasterClient) {
	return openHeldOver(t, false)
}

func openHeldOver(t *testing.T, overCRPC bool) (*Durable, *holdFS, storepb.MasterClient) {
	t.Helper()
	fs := newHoldFS()
	d, err := OpenDurable(context.Background(), t.TempDir(), master.Config{Shards: 4}, LocalOptions{FS: fs})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	mc, _ := serveDurableOver(t, d, overCRPC)
	t.Cleanup(fs.unhold)
	_, err = mc.MountSegment(context.Background(), &storepb.MountSegmentRequest{ClientId: durClient, Session: durSession, Segment: durSeg})
	require.NoError(t, err)
	return d, fs, mc
}

var (
	durSession, durClient = newSession()
	durSeg                = &storepb.Segment{Id: &storepb.UUID{High: 9, Low: 1}, Name: "127.0.0.1:1", Base: 1 << 30, Size: 1 << 20, Protocol: "tcp"}
)

func durPut(ctx context.Context, mc storepb.MasterClient, key string) error {
	if _, err := mc.PutStart(ctx, &storepb.PutStartRequest{ClientId: durClient, Session: durSession, Key: key, Size: 100}); err != nil {
		return err
	}
	_, err := mc.PutEnd(ctx, &storepb.PutEndRequest{ClientId: durClient, Session: durSession, Key: key})
	return err
}

// An RPC is answered only once what it changed is durable: with the
// log's fsync held, PutStart does not answer, and when it does its op is
// durable.
func TestDurableRPCWaitsForFsync(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	d, fs, mc := openHeld(t)
	require.Equal(t, d.Sink.Appended(), d.Sink.Durable(), "acknowledged, so durable")

	fs.hold()
	type answer struct {
		err     error
		durable uint64
	}
	got := make(chan answer, 1)
	go func() {
		_, err := mc.PutStart(ctx, &storepb.PutStartRequest{ClientId: durClient, Session: durSession, Key: "k", Size: 100})
		got <- answer{err, d.Sink.Durable()}
	}()
	<-fs.entered // the PutStart's entry is being synced
	seq := d.Sink.Appended()
	select {
	case a := <-got:
		t.Fatalf("answered (%v) with seq %d not durable (durable %d)", a.err, seq, a.durable)
	case <-time.After(200 * time.Millisecond):
	}
	fs.unhold()
	a := <-got
	require.NoError(t, a.err)
	require.GreaterOrEqual(t, a.durable, seq, "answered before its entry was durable")
	// Nothing pending: a read answers at once.
	_, err := mc.ExistKey(ctx, &storepb.ExistKeyRequest{Key: "k"})
	require.NoError(t, err)
}

// A call waiting for its entry's fsync does not hold its connection:
// over crpc, where calls may run on the connection's reader, a read of
// another key on the same connection answers while the fsync is held.
func TestDurableWaitFreesItsConnection(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	_, fs, mc := openHeldOver(t, true)
	fs.hold()
	put := make(chan error, 1)
	go func() {
		_, err := mc.PutStart(ctx, &storepb.PutStartRequest{ClientId: durClient, Session: durSession, Key: "k", Size: 100})
		put <- err
	}()
	<-fs.entered
	read := make(chan error, 1)
	go func() {
		_, err := mc.ExistKey(ctx, &storepb.ExistKeyRequest{Key: "other"})
		read <- err
	}()
	select {
	case err := <-read:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the read waited behind the held put on its connection")
	}
	select {
	case err := <-put:
		t.Fatalf("the put answered (%v) with its fsync held", err)
	default:
	}
	fs.unhold()
	require.NoError(t, <-put)
}

// A failed fsync stops the master acknowledging anything (fail-stop):
// the RPC whose entry failed and every later one answer INTERNAL_ERROR,
// and /health answers 503 with the cause.
func TestDurableFailStop(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	fs := errorfs.New(nil)
	d, err := OpenDurable(ctx, t.TempDir(), master.Config{Shards: 4}, LocalOptions{FS: fs, Logger: nil})
	require.NoError(t, err)
	defer d.Close()
	mc, svc := serveDurable(t, d)
	adminSrv := httptest.NewServer(admin.Handler(d.Master, svc, prometheus.NewRegistry(), nil))
	defer adminSrv.Close()
	health := func() (int, string) {
		resp, err := http.Get(adminSrv.URL + "/health")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	_, err = mc.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: durClient, Session: durSession, Segment: durSeg})
	require.NoError(t, err)
	require.NoError(t, durPut(ctx, mc, "before"))
	code, _ := health()
	require.Equal(t, http.StatusOK, code)

	fs.FailNth(errorfs.OpSync, 1, true, nil)
	err = durPut(ctx, mc, "after")
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrInternal, "%v", err)
	require.ErrorContains(t, err, "injected")
	_, err = mc.Remove(ctx, &storepb.RemoveRequest{Key: "before"})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrInternal, "%v", err)
	_, err = mc.ExistKey(ctx, &storepb.ExistKeyRequest{Key: "before"})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrInternal, "a read is not answered either: %v", err)
	code, body := health()
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "injected")
}

// After a restart on the same directory the master has the state it
// acknowledged; clients seen before get a grace of ClientTTL from the
// restart even when their last ping is older; clients that stay silent
// expire as usual; an unfinished put is not visible; new ops number on.
func TestDurableRecover(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	dir := t.TempDir()
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	const ttl = 10 * time.Second
	cfg := master.Config{Shards: 4, Clock: clk, ClientTTL: ttl, LivenessInterval: time.Millisecond}
	alive, dead := master.UUID{Hi: 1, Lo: 1}, master.UUID{Hi: 1, Lo: 2}
	seg := func(c master.UUID, n uint64) alloc.Segment {
		return alloc.Segment{ID: master.UUID{Hi: 2, Lo: n}, Name: "h", Base: n << 30, Size: 1 << 20, Protocol: "tcp"}
	}
	d, err := OpenDurable(ctx, dir, cfg, LocalOptions{})
	require.NoError(t, err)
	require.Zero(t, d.Replayed)
	m := d.Master
	require.NoError(t, m.MountSegment(alive, seg(alive, 1)))
	require.NoError(t, m.MountSegment(dead, seg(dead, 2)))
	for _, k := range []string{"a", "b", "c"} {
		_, err := m.PutStart(alive, k, 100, master.ReplicateConfig{Replicas: 1})
		require.NoError(t, err)
		require.NoError(t, m.PutEnd(alive, k, master.Memory, nil))
	}
	require.NoError(t, m.Remove("b", false))
	_, err = m.PutStart(alive, "unfinished", 100, master.ReplicateConfig{Replicas: 1})
	require.NoError(t, err)
	require.NoError(t, d.Wait(ctx))
	want := dumpMaster(t, m)
	last := d.Sink.Appended()
	require.NoError(t, d.Close())

	clk.Advance(3 * ttl) // the master was down longer than a client TTL
	d, err = OpenDurable(ctx, dir, cfg, LocalOptions{})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	m = d.Master
	require.Equal(t, last, d.Replayed)
	require.Equal(t, want, dumpMaster(t, m))
	require.NoError(t, m.Start())
	_, _, err = m.GetReplicaList("unfinished")
	require.Error(t, err, "an unfinished put is not readable")
	_, _, err = m.GetReplicaList("b")
	require.ErrorIs(t, err, errcode.ErrObjectNotFound)

	clk.Advance(ttl / 2)
	_, st := m.Ping(alive)
	require.Equal(t, master.ClientOK, st, "a replayed client has a grace of ClientTTL from the restart")
	reps, _, err := m.GetReplicaList("a")
	require.NoError(t, err)
	require.Len(t, reps, 1)
	clk.Advance(ttl/2 + time.Second)
	require.Eventually(t, func() bool { return len(m.AllSegments()) == 1 }, 10*time.Second, time.Millisecond,
		"the silent client expires ClientTTL after the restart")
	_, st = m.Ping(alive)
	require.Equal(t, master.ClientOK, st)
	_, st = m.Ping(dead)
	require.Equal(t, master.ClientNeedRemount, st)

	// New ops continue the log.
	_, err = m.PutStart(alive, "d", 100, master.ReplicateConfig{Replicas: 1})
	require.NoError(t, err)
	require.Greater(t, d.Sink.Appended(), last)
	require.NoError(t, d.Wait(ctx))
}

// A log that does not replay (here: a corrupt entry decodes to nothing
// valid) fails the open: no partial master serves.
func TestDurableFailsClosed(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	dir := t.TempDir()
	st, err := OpenLocal(dir, LocalOptions{})
	require.NoError(t, err)
	// A PutEnd of a key no PutStart created: the replay diverges.
	e, err := FromOp(&master.Op{Kind: master.OpPutEnd, Key: "ghost", Client: master.UUID{Hi: 1, Lo: 1}})
	require.NoError(t, err)
	e.Seq, e.Term = 1, 1
	e.Seal()
	require.NoError(t, st.Append(ctx, 1, []Entry{e}))
	require.NoError(t, st.Close())
	_, err = OpenDurable(ctx, dir, master.Config{Shards: 4}, LocalOptions{})
	require.ErrorIs(t, err, master.ErrReplayDiverged)
	// The directory was released: it opens again.
	st, err = OpenLocal(dir, LocalOptions{})
	require.NoError(t, err)
	require.NoError(t, st.Close())
}

// "Hide before durable, free after": space a remove frees can be handed
// to a new put at once, but the put's answer (the address its writer
// will overwrite) waits until the remove is durable too, since every
// RPC waits for all that was logged before it answers and the remove is
// logged before the space is reused. A crash can therefore never bring
// back the removed key over bytes a client has overwritten.
func TestDurableFreedSpaceReusedAfterDurable(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	d, fs, mc := openHeld(t)
	// "a" fills the segment: "b" can only go where "a" was.
	ra, err := mc.PutStart(ctx, &storepb.PutStartRequest{ClientId: durClient, Session: durSession, Key: "a", Size: durSeg.Size})
	require.NoError(t, err)
	_, err = mc.PutEnd(ctx, &storepb.PutEndRequest{ClientId: durClient, Session: durSession, Key: "a"})
	require.NoError(t, err)

	fs.hold()
	removed := make(chan error, 1)
	go func() {
		_, err := mc.Remove(ctx, &storepb.RemoveRequest{Key: "a"})
		removed <- err
	}()
	<-fs.entered // the remove is logged (and a's space free), not durable
	removeSeq := d.Sink.Appended()
	type answer struct {
		resp    *storepb.PutStartResponse
		err     error
		durable uint64
	}
	got := make(chan answer, 1)
	go func() {
		r, err := mc.PutStart(ctx, &storepb.PutStartRequest{ClientId: durClient, Session: durSession, Key: "b", Size: durSeg.Size})
		got <- answer{r, err, d.Sink.Durable()}
	}()
	require.Eventually(t, func() bool { return d.Sink.Appended() > removeSeq }, 10*time.Second, time.Millisecond,
		"b's PutStart is logged")
	select {
	case a := <-got:
		t.Fatalf("b's address handed out (%v) before a's remove (seq %d) was durable (durable %d)", a.err, removeSeq, a.durable)
	case <-time.After(100 * time.Millisecond):
	}
	fs.unhold()
	require.NoError(t, <-removed)
	a := <-got
	require.NoError(t, a.err)
	require.Equal(t, ra.Replicas[0].Memory.BufferAddress, a.resp.Replicas[0].Memory.BufferAddress, "b reuses a's space")
	require.GreaterOrEqual(t, a.durable, removeSeq, "b's address was handed out before a's remove was durable")
}

// A read of keys waits for the last changes of its keys only: with the
// log's fsync held under another key's write, reads of a durable key
// answer at once, and a read of the key being written (complete in the
// master's memory, its PutEnd not durable) does not answer until the
// commit.
func TestDurableReadWaitsForItsKeysOnly(t *testing.T) {
	leakCheck(t)
	ctx := context.Background()
	d, fs, mc := openHeld(t)
	require.NoError(t, durPut(ctx, mc, "a"))
	_, err := mc.PutStart(ctx, &storepb.PutStartRequest{ClientId: durClient, Session: durSession, Key: "b", Size: 100})
	require.NoError(t, err)

	fs.hold()
	ended := make(chan error, 1)
	go func() {
		_, err := mc.PutEnd(ctx, &storepb.PutEndRequest{ClientId: durClient, Session: durSession, Key: "b"})
		ended <- err
	}()
	<-fs.entered // b's PutEnd is being synced
	require.Greater(t, d.Sink.Appended(), d.Sink.Durable())

	// Reads of a: answered while the fsync is held (they used to wait
	// for it: everything logged so far).
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = mc.GetReplicaList(rctx, &storepb.GetReplicaListRequest{Key: "a"})
	require.NoError(t, err)
	ex, err := mc.ExistKey(rctx, &storepb.ExistKeyRequest{Key: "a"})
	require.NoError(t, err)
	require.True(t, ex.Exists)
	bg, err := mc.BatchGetReplicaList(rctx, &storepb.BatchGetReplicaListRequest{Keys: []string{"a", "missing"}})
	require.NoError(t, err)
	require.Len(t, bg.Results, 2)
	be, err := mc.BatchExistKey(rctx, &storepb.BatchExistKeyRequest{Keys: []string{"a"}})
	require.NoError(t, err)
	require.True(t, be.Results[0].Exists)

	// Reads that include b wait for b's commit.
	for name, read := range map[string]func(context.Context) error{
		"GetReplicaList": func(c context.Context) error {
			_, err := mc.GetReplicaList(c, &storepb.GetReplicaListRequest{Key: "b"})
			return err
		},
		"ExistKey": func(c context.Context) error {
			_, err := mc.ExistKey(c, &storepb.ExistKeyRequest{Key: "b"})
			return err
		},
		"BatchGetReplicaList": func(c context.Context) error {
			_, err := mc.BatchGetReplicaList(c, &storepb.BatchGetReplicaListRequest{Keys: []string{"a", "b"}})
			return err
		},
		"BatchExistKey": func(c context.Context) error {
			_, err := mc.BatchExistKey(c, &storepb.BatchExistKeyRequest{Keys: []string{"b", "a"}})
			return err
		},
	} {
		sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := read(sctx)
		scancel()
		require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%s of b answered (%v) before b's PutEnd was durable", name, err)
	}
	select {
	case err := <-ended:
		t.Fatalf("PutEnd answered (%v) while its fsync was held", err)
	default:
	}

	fs.unhold()
	require.NoError(t, <-ended)
	ex, err = mc.ExistKey(ctx, &storepb.ExistKeyRequest{Key: "b"})
	require.NoError(t, err)
	require.True(t, ex.Exists)
}
