package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/store/master"
)

// openLog opens the durable master on the configured log: local files
// (--data_dir) or etcd (--oplog), whose client the Durable's Close stops
// last.
func openLog(ctx context.Context, cfg config, mc master.Config, log *slog.Logger, opts ...oplog.DurableOption) (*oplog.Durable, error) {
	if cfg.DataDir != "" {
		return oplog.OpenDurable(ctx, cfg.DataDir, mc, oplog.LocalOptions{Logger: log, Syncers: cfg.OplogSyncers}, opts...)
	}
	eps, _ := oplog.ParseEtcdURL(cfg.Oplog) // validated
	cli, err := clientv3.New(oplog.EtcdClientConfig(eps))
	if err != nil {
		return nil, fmt.Errorf("oplog %s: %w", cfg.Oplog, err)
	}
	st, err := oplog.OpenEtcd(ctx, cli, oplog.EtcdOptions{ClusterID: cfg.ClusterID,
		WriteTimeout: time.Duration(cfg.OplogWriteTimeoutSec) * time.Second})
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("oplog %s: %w", cfg.Oplog, err)
	}
	d, err := oplog.Open(ctx, closingStore{st, cli}, mc, opts...)
	if err != nil {
		return nil, fmt.Errorf("oplog %s: %w", cfg.Oplog, err)
	}
	return d, nil
}

// closingStore closes the etcd client after the store.
type closingStore struct {
	*oplog.Etcd
	cli *clientv3.Client
}

func (c closingStore) Close() error { return errors.Join(c.Etcd.Close(), c.cli.Close()) }
