package haview

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/metadata/etcdmeta"
	"github.com/crescent-kv/crescent/engine/metadata/redismeta"
	"github.com/crescent-kv/crescent/ha/leader"
	"github.com/crescent-kv/crescent/store"
)

func init() {
	store.RegisterLeaderScheme("etcd", OpenEtcd)
	store.RegisterLeaderScheme("redis", OpenRedis)
	store.RegisterLeaderScheme("rediss", OpenRedis)
}

// OpenEtcd opens the leader view of clusterID on the etcd endpoints of
// addr ("etcd://h:p[,h2:p2]").
func OpenEtcd(_ context.Context, addr, clusterID string) (store.LeaderSource, error) {
	eps, err := etcdmeta.ParseEndpoints(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", store.ErrInvalidConfig, err)
	}
	cli, err := clientv3.New(leader.EtcdClientConfig(eps))
	if err != nil {
		return nil, fmt.Errorf("haview: etcd %v: %w", eps, err)
	}
	co, err := leader.NewEtcd(cli, clusterID)
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: %w", store.ErrInvalidConfig, err)
	}
	return &source{co: co, closeCli: cli.Close}, nil
}

// OpenRedis opens the leader view of clusterID on the Redis of addr
// ("redis://[user:pass@]h:p[/db]").
func OpenRedis(_ context.Context, addr, clusterID string) (store.LeaderSource, error) {
	o, err := redismeta.ParseConn(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", store.ErrInvalidConfig, err)
	}
	cli := redis.NewClient(o)
	co, err := leader.NewRedis(cli, clusterID)
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: %s: %w", store.ErrInvalidConfig, metadata.Redact(addr), err)
	}
	return &source{co: co, closeCli: cli.Close}, nil
}

type source struct {
	co       leader.Coordinator
	closeCli func() error
}

func (s *source) View(ctx context.Context) (store.LeaderView, error) {
	v, err := s.co.View(ctx)
	return store.LeaderView{Leader: v.Leader, Version: v.Version}, err
}

func (s *source) WaitChange(ctx context.Context, after uint64) (store.LeaderView, error) {
	v, err := s.co.WaitChange(ctx, after)
	return store.LeaderView{Leader: v.Leader, Version: v.Version}, err
}

func (s *source) Close() error {
	err := s.co.Close()
	if s.closeCli != nil {
		err = errors.Join(err, s.closeCli())
	}
	return err
}
