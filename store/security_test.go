package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/admin"
	"github.com/crescent-kv/crescent/store/master/service"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

var (
	testToken = []byte("cluster-token-0123456789abcdef")
	testAdmin = []byte("admin-token-0123456789abcdef")
)

// secureMaster is a real master with service options on 127.0.0.1 and
// its admin HTTP page (as crescent-master wires it: RequireAdmin).
type secureMaster struct {
	*testMaster
	adminAddr string
}

func startSecureMaster(t testing.TB, cfg master.Config, lis net.Listener, opts ...service.Option) *secureMaster {
	t.Helper()
	m, err := master.New(cfg)
	require.NoError(t, err)
	require.NoError(t, m.Start())
	if lis == nil {
		lis, err = net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
	}
	svc := service.New(m, append([]service.Option{service.WithGracePeriod(100 * time.Millisecond)}, opts...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: admin.RequireAdmin(admin.Handler(m, svc, prometheus.NewRegistry(), nil), testAdmin)}
	hdone := make(chan struct{})
	go func() { hs.Serve(hl); close(hdone) }()
	tm := &testMaster{m: m, addr: lis.Addr().String()}
	tm.stop = sync.OnceFunc(func() {
		hs.Close()
		<-hdone
		cancel()
		if err := <-done; err != nil {
			t.Errorf("master Serve: %v", err)
		}
		m.Close()
	})
	t.Cleanup(tm.stop)
	return &secureMaster{testMaster: tm, adminAddr: hl.Addr().String()}
}

// rawMaster is what an attacker on the host has: the RPC port, no
// credential.
func rawMaster(t testing.TB, addr string) storepb.MasterClient {
	t.Helper()
	cc, err := crpc.Dial(tctx(t), addr)
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return storepb.NewMasterClient(cc)
}

func requireIllegal(t testing.TB, err error, what string) {
	t.Helper()
	require.Error(t, err, what)
	assert.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrIllegalClient, what)
}

// segmentsPage is /get_all_segments as the attacker reads it.
func segmentsPage(t testing.TB, adminAddr string) []map[string]any {
	t.Helper()
	resp, err := http.Get("http://" + adminAddr + "/get_all_segments")
	require.NoError(t, err)
	defer resp.Body.Close()
	var segs []map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&segs))
	return segs
}

func parseID(t testing.TB, s string) *storepb.UUID {
	t.Helper()
	require.Len(t, s, 32)
	hi, err := strconv.ParseUint(s[:16], 16, 64)
	require.NoError(t, err)
	lo, err := strconv.ParseUint(s[16:], 16, 64)
	require.NoError(t, err)
	return &storepb.UUID{High: hi, Low: lo}
}

// TestAttackRemoveAll: RemoveAll, RemoveByRegex and a forced remove
// without the admin credential (or with a wrong one) remove nothing; the
// admin's client with it removes.
func TestAttackRemoveAll(t *testing.T) {
	sm := startSecureMaster(t, master.Config{}, nil, service.WithAdminToken(testAdmin))
	c := newTestClient(t, sm.testMaster, 8<<20)
	ctx := tctx(t)
	require.NoError(t, c.Put(ctx, "victim", []byte("value"), ReplicateConfig{}))

	raw := rawMaster(t, sm.addr)
	_, err := raw.RemoveAll(ctx, &storepb.RemoveAllRequest{Force: true})
	requireIllegal(t, err, "RemoveAll without the admin token")
	_, err = raw.RemoveAll(ctx, &storepb.RemoveAllRequest{AdminToken: []byte("guess-0123456789abcdef")})
	requireIllegal(t, err, "RemoveAll with a wrong admin token")
	_, err = raw.RemoveByRegex(ctx, &storepb.RemoveByRegexRequest{Regex: ".*"})
	requireIllegal(t, err, "RemoveByRegex")
	_, err = raw.Remove(ctx, &storepb.RemoveRequest{Key: "victim", Force: true})
	requireIllegal(t, err, "forced Remove")
	_, err = raw.BatchRemove(ctx, &storepb.BatchRemoveRequest{Keys: []string{"victim"}, Force: true})
	requireIllegal(t, err, "forced BatchRemove")
	_, err = c.RemoveAll(ctx, true)
	requireIllegal(t, err, "a client without --admin_token_file")
	v, err := c.Get(ctx, "victim")
	require.NoError(t, err)
	assert.Equal(t, "value", string(v))

	adm := newTestClient(t, sm.testMaster, 0, func(cfg *Config) { cfg.Security.Admin = testAdmin })
	n, err := adm.RemoveAll(ctx, true)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)

	// The admin page: reads open, POSTs need the token.
	resp, err := http.Get("http://" + sm.adminAddr + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	for tok, want := range map[string]int{"": http.StatusUnauthorized, "Bearer wrong-0123456789abcdef": http.StatusForbidden, "Bearer " + string(testAdmin): http.StatusNotFound} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+sm.adminAddr+"/snapshot", nil)
		if tok != "" {
			req.Header.Set("Authorization", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, "POST /snapshot with %q", tok)
	}
}

// TestAttackUnmountFromSegmentsPage: client ids read off
// /get_all_segments do not let anyone unmount those clients' segments.
func TestAttackUnmountFromSegmentsPage(t *testing.T) {
	sm := startSecureMaster(t, master.Config{}, nil)
	a := newTestClient(t, sm.testMaster, 8<<20)
	b := newTestClient(t, sm.testMaster, 8<<20)
	ctx := tctx(t)
	segs := segmentsPage(t, sm.adminAddr)
	require.Len(t, segs, 2)
	raw := rawMaster(t, sm.addr)
	mySession, hi, lo := auth.NewSession()
	mine := &storepb.UUID{High: hi, Low: lo}
	for _, s := range segs {
		victim, seg := parseID(t, s["client"].(string)), parseID(t, s["id"].(string))
		_, err := raw.UnmountSegment(ctx, &storepb.UnmountSegmentRequest{ClientId: victim, SegmentId: seg})
		requireIllegal(t, err, "unmount with the victim's id and no session")
		_, err = raw.UnmountSegment(ctx, &storepb.UnmountSegmentRequest{ClientId: victim, Session: mySession, SegmentId: seg})
		requireIllegal(t, err, "unmount with the victim's id and another session")
		_, err = raw.UnmountSegment(ctx, &storepb.UnmountSegmentRequest{ClientId: mine, Session: mySession, SegmentId: seg})
		requireIllegal(t, err, "unmount of another's segment as oneself")
		_, err = raw.ReMountSegment(ctx, &storepb.ReMountSegmentRequest{ClientId: victim, Segments: []*storepb.Segment{{Id: seg}}})
		requireIllegal(t, err, "remount as the victim")
	}
	assert.Len(t, segmentsPage(t, sm.adminAddr), 2)
	// Both keep working: puts land.
	for i, c := range []*Client{a, b} {
		require.NoError(t, c.Put(ctx, fmt.Sprint("k", i), []byte("v"), ReplicateConfig{}))
	}
	// No page shows a session.
	for _, s := range segmentsPage(t, sm.adminAddr) {
		for _, v := range s {
			assert.NotContains(t, fmt.Sprint(v), fmt.Sprintf("%x", a.session))
			assert.NotContains(t, fmt.Sprint(v), fmt.Sprintf("%x", b.session))
		}
	}
}

// TestAttackPingAsDeadClient: pinging with a dead client's id does not
// keep its segment alive; it expires.
func TestAttackPingAsDeadClient(t *testing.T) {
	sm := startSecureMaster(t, master.Config{ClientTTL: 300 * time.Millisecond, LivenessInterval: 20 * time.Millisecond}, nil)
	ctx := tctx(t)
	raw := rawMaster(t, sm.addr)
	// The victim: mounts, then dies (no more pings).
	sess, hi, lo := auth.NewSession()
	victim := &storepb.UUID{High: hi, Low: lo}
	seg := &storepb.Segment{Id: &storepb.UUID{High: 9, Low: 9}, Name: "127.0.0.1:1", Base: 1 << 30, Size: 1 << 20, Protocol: "tcp"}
	_, err := raw.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: victim, Session: sess, Segment: seg})
	require.NoError(t, err)
	other, _, _ := auth.NewSession()
	stop := make(chan struct{})
	pinged := make(chan error, 1)
	go func() {
		var first error
		for i := 0; ; i++ {
			_, err := raw.Ping(ctx, &storepb.PingRequest{ClientId: victim, Session: other})
			if i == 0 {
				first = err
				pinged <- first
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	defer close(stop)
	requireIllegal(t, <-pinged, "ping as the victim")
	eventually(t, "the dead client's segment expires", func() bool {
		_, err := sm.m.QuerySegmentStatus(master.UUID{Hi: 9, Lo: 9})
		return errors.Is(err, errcode.ErrSegmentNotFound)
	})
}

// TestAttackPutEndOfAnothersPut: ending, revoking or committing another
// client's put is refused; its owner ends it.
func TestAttackPutEndOfAnothersPut(t *testing.T) {
	sm := startSecureMaster(t, master.Config{}, nil)
	newTestClient(t, sm.testMaster, 8<<20) // memory to put into
	ctx := tctx(t)
	raw := rawMaster(t, sm.addr)
	sess, hi, lo := auth.NewSession()
	victim := &storepb.UUID{High: hi, Low: lo}
	_, err := raw.PutStart(ctx, &storepb.PutStartRequest{ClientId: victim, Session: sess, Key: "k", Size: 100})
	require.NoError(t, err)
	mySess, mhi, mlo := auth.NewSession()
	me := &storepb.UUID{High: mhi, Low: mlo}
	_, err = raw.PutEnd(ctx, &storepb.PutEndRequest{ClientId: victim, Key: "k"})
	requireIllegal(t, err, "PutEnd as the victim without its session")
	_, err = raw.PutEnd(ctx, &storepb.PutEndRequest{ClientId: victim, Session: mySess, Key: "k"})
	requireIllegal(t, err, "PutEnd as the victim with another session")
	_, err = raw.PutEnd(ctx, &storepb.PutEndRequest{ClientId: me, Session: mySess, Key: "k"})
	requireIllegal(t, err, "PutEnd of another's put")
	_, err = raw.PutRevoke(ctx, &storepb.PutRevokeRequest{ClientId: victim, Session: mySess, Key: "k"})
	requireIllegal(t, err, "PutRevoke as the victim")
	r, err := raw.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: victim, Keys: []string{"k"}})
	require.Nil(t, r)
	requireIllegal(t, err, "BatchPutEnd as the victim")
	_, err = raw.CommitPut(ctx, &storepb.CommitPutRequest{ClientId: victim})
	requireIllegal(t, err, "CommitPut as the victim")
	_, err = raw.PutEnd(ctx, &storepb.PutEndRequest{ClientId: victim, Session: sess, Key: "k"})
	require.NoError(t, err)
}

// TestClusterTokenRequired: a master with the cluster token serves
// clients that hold it (crpc and gRPC) and refuses, before any call, one
// without it or with a wrong one.
func TestClusterTokenRequired(t *testing.T) {
	sm := startSecureMaster(t, master.Config{}, nil, service.WithTransportSecurity(nil, testToken, nil))
	ctx := tctx(t)
	for _, proto := range []string{"auto", "crpc", "grpc"} {
		c := newTestClient(t, sm.testMaster, 8<<20, func(cfg *Config) { cfg.Security.Token = testToken; cfg.MasterProtocol = proto })
		require.NoError(t, c.Put(ctx, "k-"+proto, []byte("v"), ReplicateConfig{}), proto)
	}
	for _, proto := range []string{"auto", "crpc"} {
		_, err := New(ctx, Config{MasterAddr: sm.addr, MasterProtocol: proto, LocalHostname: "127.0.0.1", LocalBufferSize: 1 << 20, Logger: quiet})
		require.ErrorIs(t, err, crpc.ErrTokenRequired, proto)
		_, err = New(ctx, Config{MasterAddr: sm.addr, MasterProtocol: proto, LocalHostname: "127.0.0.1", LocalBufferSize: 1 << 20, Logger: quiet,
			Security: Security{Token: []byte("wrong-token-0123456789abcdef")}})
		require.ErrorIs(t, err, auth.ErrRefused, proto)
	}
	// A plaintext gRPC client gets no answer.
	gc, err := grpc.NewClient(sm.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer gc.Close()
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = storepb.NewMasterClient(gc).ServiceReady(sctx, &storepb.ServiceReadyRequest{})
	require.Error(t, err)
}

// The engine a client starts takes the cluster token too: one credential
// for the master's port and the data plane.
func TestClusterTokenReachesEngine(t *testing.T) {
	sm := startSecureMaster(t, master.Config{}, nil, service.WithTransportSecurity(nil, testToken, nil))
	ctx := tctx(t)
	c := newTestClient(t, sm.testMaster, 8<<20, func(cfg *Config) { cfg.Security.Token = testToken })
	addr := c.Engine().Name()
	require.Error(t, metadata.Client{}.SendProbe(ctx, addr), "the engine's handshake port answered a peer without the token")
	require.NoError(t, metadata.Client{Token: testToken}.SendProbe(ctx, addr))
}
