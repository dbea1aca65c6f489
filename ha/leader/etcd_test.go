package leader

import (
	"context"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
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
	base := runtime.NumGoroutine()
	for range 200 {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := c.WaitChange(wctx, 0); done <- err }()
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	}
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= base+2 },
		10*time.Second, 20*time.Millisecond, "goroutines %d, base %d", runtime.NumGoroutine(), base)
}

// etcdCluster is an in-process multi-member etcd.
type etcdCluster struct {
	members   []*embed.Etcd
	endpoints []string
	stopped   []sync.Once
}

func startEtcdCluster(t *testing.T, n int) *etcdCluster {
	var lastErr error
	for range 3 { // ports picked free may be taken meanwhile
		c, err := tryEtcdCluster(t, n)
		if err == nil {
			return c
		}
		lastErr = err
	}
	t.Fatalf("etcd cluster: %v", lastErr)
	return nil
}

func tryEtcdCluster(t *testing.T, n int) (*etcdCluster, error) {
	cfgs := make([]*embed.Config, n)
	var initial []string
	for i := range n {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = t.TempDir()
		cfg.UnsafeNoFsync = true
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", testsvc.FreePort(t))}
		pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", testsvc.FreePort(t))}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
		initial = append(initial, cfg.Name+"="+pu.String())
		cfgs[i] = cfg
	}
	c := &etcdCluster{stopped: make([]sync.Once, n)}
	for _, cfg := range cfgs {
		cfg.InitialCluster = strings.Join(initial, ",")
		m, err := embed.StartEtcd(cfg)
		if err != nil {
			c.stopAll()
			return nil, err
		}
		c.members = append(c.members, m)
		c.endpoints = append(c.endpoints, cfg.ListenClientUrls[0].Host)
	}
	for _, m := range c.members {
		select {
		case <-m.Server.ReadyNotify():
		case err := <-m.Err():
			c.stopAll()
			return nil, err
		case <-time.After(60 * time.Second):
			c.stopAll()
			return nil, fmt.Errorf("member not ready")
		}
	}
	t.Cleanup(c.stopAll)
	return c, nil
}

func (c *etcdCluster) stop(i int) { c.stopped[i].Do(c.members[i].Close) }

func (c *etcdCluster) stopAll() {
	for i := range c.members {
		c.stop(i)
	}
}

// TestEtcdMemberStopKeepsLeadership stops one member of three: quorum
// remains, so the session lives on.
func TestEtcdMemberStopKeepsLeadership(t *testing.T) {
	cl := startEtcdCluster(t, 3)
	cli := etcdClient(t, cl.endpoints...)
	c, err := NewEtcd(cli, "m", WithTTL(etcdTTL))
	require.NoError(t, err)
	defer c.Close()
	ctx := ctxT(t)
	s, v, err := c.TryAcquire(ctx, "a:1")
	require.NoError(t, err)
	// Stop the etcd leader: the worst member to lose.
	lead := 0
	for i, m := range cl.members {
		if m.Server.Leader() == m.Server.MemberID() {
			lead = i
		}
	}
	cl.stop(lead)
	require.Never(t, func() bool { return isClosed(s.Lost()) }, 3*etcdTTL, 50*time.Millisecond,
		"session lost: %v", s.Err())
	require.NoError(t, s.Renew(ctx))
	got, err := c.View(ctx)
	require.NoError(t, err)
	require.Equal(t, v, got)
	require.NoError(t, s.Release(ctx))
}

// TestEtcdClusterStopRenewError stops every member: the keep-alive
// cannot reach anyone and the session ends with ErrRenew.
func TestEtcdClusterStopRenewError(t *testing.T) {
	cl := startEtcdCluster(t, 3)
	cli := etcdClient(t, cl.endpoints...)
	c, err := NewEtcd(cli, "all", WithTTL(etcdTTL))
	require.NoError(t, err)
	defer c.Close()
	s, _, err := c.TryAcquire(ctxT(t), "a:1")
	require.NoError(t, err)
	fired := make(chan error, 1)
	Monitor(s, func(r error) { fired <- r })
	cl.stopAll()
	require.Eventually(t, func() bool { return isClosed(s.Lost()) }, 5*etcdTTL, 50*time.Millisecond)
	require.ErrorIs(t, s.Err(), ErrRenew)
	require.ErrorIs(t, <-fired, ErrRenew)
	rctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	s.Release(rctx) // nobody to talk to; must still return
}
