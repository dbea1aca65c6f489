package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/ha/leader"
	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/master"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testsvc.GoleakIgnores()...) }

func TestRoleString(t *testing.T) {
	assert.Equal(t, []string{"standby", "candidate", "warmup", "leader", "role(7)"},
		[]string{Standby.String(), Candidate.String(), Warmup.String(), Leader.String(), Role(7).String()})
}

func TestNewErrors(t *testing.T) {
	ok := Config{
		Coordinator:  func(context.Context, uint64) (leader.Coordinator, error) { return nil, nil },
		OpenLog:      func(context.Context, uint64) (oplog.Store, error) { return nil, nil },
		Replica:      func(context.Context, master.OpSink) (*master.Master, uint64, error) { return nil, 0, nil },
		Serve:        func(context.Context, *oplog.Durable, func() error) error { return nil },
		Advertise:    "127.0.0.1:1",
		TTL:          time.Second,
		Released:     func(context.Context, uint64) error { return nil },
		ReleasedTerm: func(context.Context) (uint64, error) { return 0, nil },
	}
	_, err := New(ok)
	require.NoError(t, err)
	for name, f := range map[string]func(*Config){
		"no serve":     func(c *Config) { c.Serve = nil },
		"no advertise": func(c *Config) { c.Advertise = "" },
		"no ttl":       func(c *Config) { c.TTL = 0 },
		"half marker":  func(c *Config) { c.ReleasedTerm = nil },
	} {
		c := ok
		f(&c)
		_, err := New(c)
		assert.Error(t, err, name)
	}
}

// node is one in-process supervisor on a shared etcd.
type node struct {
	name    string
	sup     *Supervisor
	cancel  context.CancelFunc
	done    chan error
	serving chan context.Context // one per term served: Serve's ctx
	durs    chan *oplog.Durable  // and what it served
	leases  chan func() error    // and its lease
}

func startNode(t *testing.T, ep, name string, released *atomic.Uint64) *node {
	t.Helper()
	cli, err := clientv3.New(leader.EtcdClientConfig([]string{ep}))
	require.NoError(t, err)
	n := &node{name: name, done: make(chan error, 1), serving: make(chan context.Context, 16),
		durs: make(chan *oplog.Durable, 16), leases: make(chan func() error, 16)}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sup, err := New(Config{
		Coordinator: func(context.Context, uint64) (leader.Coordinator, error) {
			return leader.NewEtcd(cli, "sup", leader.WithTTL(time.Second))
		},
		Advertise: name + ":1",
		TTL:       time.Second,
		OpenLog: func(ctx context.Context, term uint64) (oplog.Store, error) {
			return oplog.OpenEtcd(ctx, cli, oplog.EtcdOptions{ClusterID: "sup", Term: term})
		},
		Replica: func(_ context.Context, sink master.OpSink) (*master.Master, uint64, error) {
			m, err := master.New(master.Config{OpLog: sink, Logger: log})
			return m, 0, err
		},
		Serve: func(ctx context.Context, d *oplog.Durable, lease func() error) error {
			n.durs <- d
			n.leases <- lease
			n.serving <- ctx
			<-ctx.Done()
			return nil
		},
		Released:     func(_ context.Context, term uint64) error { released.Store(term); return nil },
		ReleasedTerm: func(context.Context) (uint64, error) { return released.Load(), nil },
		Retry:        50 * time.Millisecond,
		Logger:       log,
	})
	require.NoError(t, err)
	n.sup = sup
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() { n.done <- sup.Run(ctx) }()
	t.Cleanup(func() {
		n.stop(t)
		cli.Close()
	})
	return n
}

func (n *node) stop(t *testing.T) {
	n.cancel()
	select {
	case err, ok := <-n.done:
		if ok {
			require.NoError(t, err)
			close(n.done)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: Run did not return", n.name)
	}
}

func roleOf(t *testing.T, n *node) RoleJSON {
	rec := httptest.NewRecorder()
	n.sup.RoleHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/role", nil))
	var r RoleJSON
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &r))
	return r
}

func waitServing(t *testing.T, nodes ...*node) (*node, context.Context) {
	t.Helper()
	select {
	case ctx := <-nodes[0].serving:
		return nodes[0], ctx
	case ctx := <-nodes[1].serving:
		return nodes[1], ctx
	case <-time.After(30 * time.Second):
		t.Fatal("nobody serves")
		return nil, nil
	}
}

// Two supervisors: one serves, the other is a standby with the view;
// the leader's Run ending (SIGTERM) releases, and the standby then
// serves without a warm-up (the released marker is the log's term).
func TestHandoffOnShutdown(t *testing.T) {
	e := testsvc.StartEtcd(t)
	var released atomic.Uint64
	a, b := startNode(t, e.Endpoint, "a", &released), startNode(t, e.Endpoint, "b", &released)
	first, _ := waitServing(t, a, b)
	other := b
	if first == b {
		other = a
	}
	fr := roleOf(t, first)
	assert.Equal(t, "leader", fr.Role)
	assert.Equal(t, first.name+":1", fr.Leader)
	require.NotZero(t, fr.Term)
	require.Eventually(t, func() bool {
		r := roleOf(t, other)
		return r.Role == "standby" && r.Leader == first.name+":1" && r.Term == 0
	}, 10*time.Second, 10*time.Millisecond)
	rec := httptest.NewRecorder()
	other.sup.NotServing(rec)
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.True(t, first.sup.Serving())
	assert.False(t, other.sup.Serving())

	first.stop(t)
	assert.Equal(t, fr.Term, released.Load(), "the marker holds the term that stopped")
	ctx := <-other.serving
	require.NoError(t, ctx.Err())
	or := roleOf(t, other)
	assert.Equal(t, "leader", or.Role)
	assert.Greater(t, or.Term, fr.Term)
	tts := gather(t, other.sup)["crescent_ha_time_to_serve_seconds"]
	require.Len(t, tts, 1)
	assert.Less(t, tts[0], 1.0, "no warm-up after a release")

	rec = httptest.NewRecorder()
	other.sup.LeaderHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/leader", nil))
	assert.JSONEq(t, fmt.Sprintf(`{"leader":"%s:1","view_version":%d}`, other.name, or.Term), rec.Body.String())
}

// Losing the session (its view deleted behind its back) cancels
// Serve's context and sends the master back to standby, from where it
// is elected again in a new round, with a new term.
func TestLossStopsServing(t *testing.T) {
	e := testsvc.StartEtcd(t)
	var released atomic.Uint64
	cli, err := clientv3.New(leader.EtcdClientConfig([]string{e.Endpoint}))
	require.NoError(t, err)
	defer cli.Close()
	a := startNode(t, e.Endpoint, "a", &released)
	ctx := <-a.serving
	term := roleOf(t, a).Term
	_, err = cli.Delete(context.Background(), "crescent/sup/master_view")
	require.NoError(t, err)
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Serve's context was not cancelled on loss")
	}
	ctx2 := <-a.serving
	require.NoError(t, ctx2.Err())
	r := roleOf(t, a)
	assert.Equal(t, "leader", r.Role)
	assert.Greater(t, r.Term, term)
	m := gather(t, a.sup)
	assert.Equal(t, []float64{2}, m["crescent_ha_elections_total"])
	assert.Len(t, m["crescent_ha_role"], 4)
	assert.Equal(t, []float64{float64(r.Term)}, m["crescent_ha_term"])
	assert.Len(t, m["crescent_ha_follower_applied_seq"], 1)
}

// TestLeaseEndsAtDeadline: with etcd gone nothing renews the session;
// Serve's lease says no from the session's deadline on (what the RPC
// gate checks), and Serve's context ends.
func TestLeaseEndsAtDeadline(t *testing.T) {
	e := testsvc.StartEtcd(t)
	var released atomic.Uint64
	a := startNode(t, e.Endpoint, "a", &released)
	ctx := <-a.serving
	lease := <-a.leases
	require.NoError(t, lease())
	e.Stop()
	require.Eventually(t, func() bool { return lease() != nil }, 30*time.Second, 10*time.Millisecond)
	assert.Contains(t, lease().Error(), "lease")
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Serve's context was not cancelled at the deadline")
	}
}

// gather returns the supervisor's metrics by name: the values of
// each family's samples.
func gather(t *testing.T, s *Supervisor) map[string][]float64 {
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(s.Collector()))
	fams, err := reg.Gather()
	require.NoError(t, err)
	out := map[string][]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[f.GetName()] = append(out[f.GetName()], v)
		}
	}
	return out
}

// A leader whose log fails (here: fenced by a claim with a higher term,
// its session still alive) acknowledges nothing more and steps down:
// Serve's context is cancelled and it leaves the leader role.
func TestFailedLogStepsDown(t *testing.T) {
	e := testsvc.StartEtcd(t)
	var released atomic.Uint64
	cli, err := clientv3.New(oplog.EtcdClientConfig([]string{e.Endpoint}))
	require.NoError(t, err)
	defer cli.Close()
	a := startNode(t, e.Endpoint, "a", &released)
	ctx := <-a.serving
	d := <-a.durs
	st, err := oplog.OpenEtcd(context.Background(), cli, oplog.EtcdOptions{ClusterID: "sup", Term: 1 << 40})
	require.NoError(t, err)
	require.NoError(t, st.Close())
	seg := alloc.Segment{ID: alloc.UUID{Hi: 1, Lo: 1}, Name: "s", Base: 1 << 30, Size: 1 << 20, Protocol: "tcp"}
	require.NoError(t, d.Master.MountSegment(alloc.UUID{Hi: 2, Lo: 2}, seg)) // its append is fenced
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("a leader with a failed log kept serving")
	}
	require.Error(t, d.Failed())
	require.Eventually(t, func() bool { return !a.sup.Serving() }, 10*time.Second, 10*time.Millisecond)
}
