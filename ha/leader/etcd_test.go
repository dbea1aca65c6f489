package leader

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdTTL is the lease TTL in the etcd tests (etcd's minimum here).
const etcdTTL = 2 * time.Second

func etcdClient(t *testing.T, endpoints ...string) *clientv3.Client {
	cli, err := clientv3.New(EtcdClientConfig(endpoints))
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

func etcdHarness(t *testing.T, cli *clientv3.Client) harness {
	return harness{
		ttl: etcdTTL,
		newCoord: func(t *testing.T, id string) Coordinator {
			c, err := NewEtcd(cli, id, WithTTL(etcdTTL))
			require.NoError(t, err)
			return c
		},
		steal: func(t *testing.T, s Session) {
			_, err := cli.Revoke(context.Background(), s.(*etcdSession).lease)
			require.NoError(t, err)
		},
	}
}

func TestEtcdContract(t *testing.T) {
	e := testsvc.StartEtcd(t)
	runContract(t, etcdHarness(t, etcdClient(t, e.Endpoint)))
}

func TestEtcdKeyDeletedLost(t *testing.T) {
	e := testsvc.StartEtcd(t)
	cli := etcdClient(t, e.Endpoint)
	c, err := NewEtcd(cli, "del", WithTTL(etcdTTL))
	require.NoError(t, err)
	defer c.Close()
	ctx := ctxT(t)
	s, v, err := c.TryAcquire(ctx, "a:1")
	require.NoError(t, err)
	// The key as written: <prefix>/<cluster>/master_view = address,
	// create revision = version.
	resp, err := cli.Get(ctx, "crescent/del/master_view")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "a:1", string(resp.Kvs[0].Value))
	require.Equal(t, v.Version, uint64(resp.Kvs[0].CreateRevision))
	require.NotZero(t, resp.Kvs[0].Lease)
	_, err = cli.Delete(ctx, "crescent/del/master_view")
	require.NoError(t, err)
	// Within a TTL: the lease is still alive, only the watch can tell.
	require.Eventually(t, func() bool { return isClosed(s.Lost()) }, etcdTTL, 10*time.Millisecond)
	require.ErrorIs(t, s.Err(), ErrLeadershipLost)
	require.NoError(t, s.Release(ctx))
}

func TestEtcdBadConfig(t *testing.T) {
	e := testsvc.StartEtcd(t)
	cli := etcdClient(t, e.Endpoint)
	for _, tc := range []struct {
		id   string
		opts []Option
	}{
		{"", nil}, {"a/b", nil}, {"x", []Option{WithPrefix("")}},
		{"x", []Option{WithTTL(0)}}, {"x", []Option{WithMinTerm(3)}},
	} {
		_, err := NewEtcd(cli, tc.id, tc.opts...)
		require.ErrorIs(t, err, ErrInvalid, "id %q", tc.id)
	}
	_, err := NewEtcd(nil, "x")
	require.ErrorIs(t, err, ErrInvalid)
}

// TestEtcdWaitChangeNoBuildUp cancels WaitChange 200 times: the
// watches it opened must all go away.
func TestEtcdWaitChangeNoBuildUp(t *testing.T) {
	e := testsvc.StartEtcd(t)
	cli := etcdClient(t, e.Endpoint)
	c, err := NewEtcd(cli, "wc", WithTTL(etcdTTL))
	require.NoError(t, err)
	defer c.Close()
	ctx := ctxT(t)
	_, err = c.View(ctx) // the connection's goroutines exist before the count
	require.NoError(t, err)
	// Only the client side counts: the embedded etcd server in this
	// process starts and ends goroutines of its own at any time.
	base := clientGoroutines()
	require.Positive(t, base, "the filter sees the client's goroutines")
	for range 200 {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := c.WaitChange(wctx, 0); done <- err }()
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	}
	// A leak is one watch stream per call, 200 or more; the client's
	// connection may redial under load and change its count by a few.
	last := clientGoroutines()
	for end := time.Now().Add(10 * time.Second); last > base+10 && time.Now().Before(end); last = clientGoroutines() {
		time.Sleep(20 * time.Millisecond)
	}
	require.LessOrEqual(t, last, base+10, "client goroutines after 200 cancelled waits, base %d", base)
}

// clientGoroutines counts the goroutines running etcd's client or this
// package's code, leaving out those the in-process server started.
func clientGoroutines() int {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "go.etcd.io/etcd/server/") {
			continue
		}
		if strings.Contains(g, "go.etcd.io/etcd/client/v3") || strings.Contains(g, "crescent/ha/leader.") {
			n++
		}
	}
	return n
}

// startCluster starts a 3-member etcd cluster and, after its cleanup has
// closed it, waits for its members' connections to end, so that the
// package's leak check passes when a cluster test runs last.
func startCluster(t *testing.T) *testsvc.EtcdCluster {
	t.Cleanup(func() { testsvc.AwaitHTTPQuiet(30 * time.Second) })
	return testsvc.StartEtcdCluster(t, 3)
}

// TestEtcdMemberStopKeepsLeadership stops one member of three: quorum
// remains, so the session lives on.
func TestEtcdMemberStopKeepsLeadership(t *testing.T) {
	cl := startCluster(t)
	cli := etcdClient(t, cl.Endpoints...)
	c, err := NewEtcd(cli, "m", WithTTL(etcdTTL))
	require.NoError(t, err)
	defer c.Close()
	ctx := ctxT(t)
	s, v, err := c.TryAcquire(ctx, "a:1")
	require.NoError(t, err)
	// Stop the etcd leader: the worst member to lose.
	lead := cl.Leader()
	require.GreaterOrEqual(t, lead, 0)
	cl.Stop(lead)
	require.Never(t, func() bool { return isClosed(s.Lost()) }, 3*etcdTTL, 50*time.Millisecond,
		"session lost: %v", s.Err())
	require.NoError(t, s.Renew(ctx))
	got, err := c.View(ctx)
	require.NoError(t, err)
	require.Equal(t, v, got)
	require.NoError(t, s.Release(ctx))
}

// TestEtcdClusterStopRenewError: every member becomes unreachable at
// once (the client reaches each through a proxy, and the proxies stop,
// refusing connections as stopped members do): the keep-alive cannot
// reach anyone and the session ends with ErrRenew at its deadline.
// Members closed one after another (as this test did before) keep a
// quorum serving while the first hand their leadership on, seconds on a
// loaded machine, and a quorum that no renewal reaches for a TTL rightly
// expires the lease, which the session then learns as ErrLeadershipLost
// (seen once in CI).
func TestEtcdClusterStopRenewError(t *testing.T) {
	cl := startCluster(t)
	var pxs []*testutil.Proxy
	var eps []string
	for _, ep := range cl.Endpoints {
		px := testutil.NewProxy(t, ep)
		pxs, eps = append(pxs, px), append(eps, px.Addr())
	}
	cli := etcdClient(t, eps...)
	c, err := NewEtcd(cli, "all", WithTTL(etcdTTL))
	require.NoError(t, err)
	defer c.Close()
	s, _, err := c.TryAcquire(ctxT(t), "a:1")
	require.NoError(t, err)
	fired := make(chan error, 1)
	Monitor(s, func(r error) { fired <- r })
	for _, px := range pxs {
		px.Stop()
	}
	require.Eventually(t, func() bool { return isClosed(s.Lost()) }, 5*etcdTTL, 50*time.Millisecond)
	require.ErrorIs(t, s.Err(), ErrRenew)
	// It ended at its own deadline, not before.
	require.False(t, time.Now().Before(s.Deadline()), "lost before the deadline %v", s.Deadline())
	require.ErrorIs(t, <-fired, ErrRenew)
	rctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	s.Release(rctx) // nobody to talk to; must still return
}
