package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/engine/metadata/httpmeta"
	"github.com/crescent-kv/crescent/event"
	"github.com/crescent-kv/crescent/ha/leader"
	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/ha/supervisor"
	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/grpctune"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/admin"
	"github.com/crescent-kv/crescent/store/master/service"
)

// haConfig is the HA part of config (YAML keys of the same names).
type haConfig struct {
	HABackend     string `yaml:"ha_backend"`
	HAEndpoints   string `yaml:"ha_endpoints"`
	HALeaseTTLSec int64  `yaml:"ha_lease_ttl_sec"`
	// HAWarmupMs is the new leader's wait before serving (-1: one TTL).
	HAWarmupMs int64 `yaml:"ha_warmup_ms"`
	// AdvertiseAddress is the RPC address put into the leader view.
	AdvertiseAddress string `yaml:"advertise_address"`
}

func (c *config) haFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.HABackend, "ha_backend", c.HABackend, "etcd or redis: run as one of several masters, one leader elected there, the others hot standbys following --oplog (empty: no HA)")
	fs.StringVar(&c.HAEndpoints, "ha_endpoints", c.HAEndpoints, "host:port[,host:port]: the etcd endpoints, or the redis host:port, of --ha_backend (default for etcd: --oplog's)")
	fs.Int64Var(&c.HALeaseTTLSec, "ha_lease_ttl_sec", c.HALeaseTTLSec, "leader lease TTL, whole seconds: a dead leader is replaced within about two of them")
	fs.Int64Var(&c.HAWarmupMs, "ha_warmup_ms", c.HAWarmupMs, "ms a new leader waits before serving after an old one died (-1: one full lease TTL, the reference's warm-up); old leaders stop answering at their own lease deadline, so this covers only clock rates and their stop")
	fs.StringVar(&c.AdvertiseAddress, "advertise_address", c.AdvertiseAddress, "host:port of this master's RPC port as clients reach it, put into the leader view (default rpc_address:rpc_port; never 0.0.0.0)")
}

func (c *config) validateHA() error {
	if c.HABackend == "" {
		return nil
	}
	switch c.HABackend {
	case "etcd", "redis":
	default:
		return fmt.Errorf("ha_backend %q: want etcd or redis", c.HABackend)
	}
	switch {
	case c.DataDir != "":
		return errors.New("ha_backend needs the operation log in etcd (--oplog etcd://...): a --data_dir log cannot be followed by another machine")
	case c.Oplog == "":
		return errors.New("ha_backend needs --oplog etcd://host:port[,host:port]: standbys follow the leader's log there")
	case c.HALeaseTTLSec < 1 || c.HALeaseTTLSec > 3600:
		return fmt.Errorf("ha_lease_ttl_sec %d not in [1, 3600]", c.HALeaseTTLSec)
	case c.HAWarmupMs < -1 || c.HAWarmupMs > 3600_000:
		return fmt.Errorf("ha_warmup_ms %d not in [-1, 3600000]", c.HAWarmupMs)
	case c.RPCPort == 0:
		return errors.New("ha_backend needs a fixed rpc_port (0 picks a port nobody could advertise)")
	case c.SnapshotDir != "" && c.SnapshotCatalog == "":
		// A catalog in one master's directory is locked by it and unseen
		// by the others: a standby could not rebuild after a compaction.
		return errors.New("ha_backend with snapshot_dir needs --snapshot_catalog redis://...: every master must see the snapshots (and read snapshot_dir)")
	case c.HABackend == "redis" && c.HAEndpoints == "":
		return errors.New("ha_backend redis needs --ha_endpoints host:port")
	}
	if _, err := c.haEndpoints(); err != nil {
		return err
	}
	_, err := c.advertise()
	return err
}

// haEndpoints is --ha_endpoints split, or --oplog's endpoints for etcd.
func (c *config) haEndpoints() ([]string, error) {
	if c.HAEndpoints == "" {
		return oplog.ParseEtcdURL(c.Oplog)
	}
	var eps []string
	for _, ep := range strings.Split(c.HAEndpoints, ",") {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			return nil, fmt.Errorf("ha_endpoints %q: %w", c.HAEndpoints, err)
		}
		eps = append(eps, ep)
	}
	if c.HABackend == "redis" && len(eps) != 1 {
		return nil, fmt.Errorf("ha_endpoints %q: redis takes one host:port", c.HAEndpoints)
	}
	return eps, nil
}

// advertise is the address of the leader view: clients dial it.
func (c *config) advertise() (string, error) {
	a := c.AdvertiseAddress
	if a == "" {
		a = net.JoinHostPort(c.RPCAddress, strconv.Itoa(c.RPCPort))
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return "", fmt.Errorf("advertise_address %q: %w", a, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("advertise_address %q: port must be in [1, 65535]", a)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return "", fmt.Errorf("advertise_address %q: clients cannot dial %q; set --advertise_address (or --rpc_address) to this machine's address", a, host)
	}
	return a, nil
}

// runHA is run with --ha_backend: a supervisor cycles this master through
// standby, candidate, warm-up and leader (ha/supervisor). The admin port
// is always up; the RPC port is bound only while leading.
func runHA(ctx context.Context, cfg config, mc master.Config, pub *event.Publisher, log *slog.Logger) error {
	ttl := time.Duration(cfg.HALeaseTTLSec) * time.Second
	adv, _ := cfg.advertise() // validated
	haEps, _ := cfg.haEndpoints()
	logEps, _ := oplog.ParseEtcdURL(cfg.Oplog)
	logCli, err := clientv3.New(oplog.EtcdClientConfig(logEps))
	if err != nil {
		return fmt.Errorf("oplog %s: %w", cfg.Oplog, err)
	}
	defer logCli.Close()

	var newCoord func(ctx context.Context, logTerm uint64) (leader.Coordinator, error)
	lopts := []leader.Option{leader.WithPrefix("crescent"), leader.WithTTL(ttl)}
	switch cfg.HABackend {
	case "etcd":
		cli, err := clientv3.New(leader.EtcdClientConfig(haEps))
		if err != nil {
			return fmt.Errorf("ha_endpoints: %w", err)
		}
		defer cli.Close()
		// etcd terms are revisions: they never go back, so no min term.
		newCoord = func(context.Context, uint64) (leader.Coordinator, error) {
			return leader.NewEtcd(cli, cfg.ClusterID, lopts...)
		}
	case "redis":
		rc := redis.NewClient(&redis.Options{Addr: haEps[0], DialTimeout: 2 * time.Second,
			ReadTimeout: ttl / 3, WriteTimeout: ttl / 3, ContextTimeoutEnabled: true})
		defer rc.Close()
		newCoord = func(_ context.Context, logTerm uint64) (leader.Coordinator, error) {
			return leader.NewRedis(rc, cfg.ClusterID, append(lopts, leader.WithMinTerm(logTerm))...)
		}
	}

	var snaps *snapshots
	if cfg.SnapshotDir != "" {
		if snaps, err = openSnapshots(cfg, log); err != nil {
			return err
		}
		defer snaps.close()
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if snaps != nil {
		reg.MustRegister(snaps.metrics.collectors()...)
	}
	if pub != nil {
		reg.MustRegister(pub.Collector())
	}
	lead := &leading{}

	sup, err := supervisor.New(supervisor.Config{
		Coordinator: newCoord,
		Advertise:   adv,
		TTL:         ttl,
		Warmup:      warmup(cfg, ttl),
		OpenLog: func(ctx context.Context, term uint64) (oplog.Store, error) {
			return oplog.OpenEtcd(ctx, logCli, oplog.EtcdOptions{ClusterID: cfg.ClusterID, Term: term,
				WriteTimeout: time.Duration(cfg.OplogWriteTimeoutSec) * time.Second})
		},
		Replica: func(ctx context.Context, sink master.OpSink) (*master.Master, uint64, error) {
			rc := mc
			rc.OpLog = sink
			if snaps != nil && snaps.catalog != nil {
				m, meta, err := oplog.LoadLatest(ctx, snaps.payloads, snaps.catalog, rc)
				return m, meta.Seq, err
			}
			m, err := master.New(rc)
			return m, 0, err
		},
		// The released marker lives next to the log, whatever the backend.
		Released: func(ctx context.Context, term uint64) error {
			_, err := logCli.Put(ctx, releasedKey(cfg.ClusterID), strconv.FormatUint(term, 10))
			return err
		},
		ReleasedTerm: func(ctx context.Context) (uint64, error) {
			r, err := logCli.Get(ctx, releasedKey(cfg.ClusterID))
			if err != nil || len(r.Kvs) == 0 {
				return 0, err
			}
			return strconv.ParseUint(string(r.Kvs[0].Value), 10, 64)
		},
		Serve: func(ctx context.Context, d *oplog.Durable, lease func() error) error {
			return serveLeader(ctx, cfg, mc, d, lease, snaps, lead, log)
		},
		Logger: log,
	})
	if err != nil {
		return err
	}
	reg.MustRegister(sup.Collector(), lead)
	role := func() admin.Role {
		st := sup.Status()
		return admin.Role{Role: st.Role.String(), Term: st.Term, Leader: st.View.Leader}
	}
	lead.role = role

	servers := &httpServers{log: log, sec: cfg.sec}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		servers.shutdown(sctx)
		if pub != nil {
			if perr := pub.Close(sctx); perr != nil {
				log.Warn("kv events not all delivered", "err", perr)
			}
		}
	}()
	serve := servers.serve
	if cfg.MetricsPort > 0 {
		mux := http.NewServeMux()
		mux.Handle("/role", sup.RoleHandler())
		mux.Handle("/leader", sup.LeaderHandler())
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.Handle("/{$}", admin.StatusPage()) // a standby shows its role there too
		mux.HandleFunc("/status.json", func(w http.ResponseWriter, r *http.Request) {
			if h := lead.handler(); h != nil && sup.Serving() {
				h.ServeHTTP(w, r)
				return
			}
			admin.NotServingStatus(w, role())
		})
		// Everything else is the leader's admin page (/health included:
		// 503 on a failed log), or 503 with the role.
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			if h := lead.handler(); h != nil && sup.Serving() {
				h.ServeHTTP(w, r)
				return
			}
			sup.NotServing(w)
		})
		if err := serve(net.JoinHostPort(cfg.RPCAddress, strconv.Itoa(cfg.MetricsPort)), mux); err != nil {
			return err
		}
	}
	if cfg.EnableHTTPMetadataServer {
		mux := http.NewServeMux()
		mux.Handle("/metadata", httpmeta.Handler())
		if err := servers.serveMetadata(net.JoinHostPort(cfg.HTTPMetadataServerHost, strconv.Itoa(cfg.HTTPMetadataServerPort)), mux); err != nil {
			return err
		}
	}
	log.Info("crescent-master supervising", "ha_backend", cfg.HABackend, "advertise", adv, "lease_ttl", ttl, "cluster_id", cfg.ClusterID)
	err = sup.Run(ctx)
	log.Info("crescent-master stopping")
	return err
}

// releasedKey is the etcd key of supervisor.Config.Released's marker:
// the decimal term of the last leader that stopped serving.
func releasedKey(clusterID string) string { return "crescent/" + clusterID + "/released_term" }

// leading holds what the current term serves: the admin handler and the
// metrics of the master and its log (nil while not leading).
type leading struct {
	mu   sync.Mutex
	h    http.Handler
	cols []prometheus.Collector
	role func() admin.Role // for the status page; set before Run
}

func (l *leading) set(h http.Handler, cols ...prometheus.Collector) {
	l.mu.Lock()
	l.h, l.cols = h, cols
	l.mu.Unlock()
}

func (l *leading) handler() http.Handler {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h
}

// Describe sends nothing: what is collected changes with the term (an
// unchecked collector).
func (l *leading) Describe(chan<- *prometheus.Desc) {}

func (l *leading) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	cols := l.cols
	l.mu.Unlock()
	for _, c := range cols {
		c.Collect(ch)
	}
}

// serveLeader serves d on the RPC port, gRPC and crpc as without HA,
// until ctx ends.
func serveLeader(ctx context.Context, cfg config, mc master.Config, d *oplog.Durable, lease func() error, snaps *snapshots, lead *leading, log *slog.Logger) error {
	var adminOpts []admin.Option
	if snaps != nil {
		var err error
		if adminOpts, err = snaps.start(cfg, d, mc); err != nil {
			return err
		}
		defer snaps.stop()
	}
	var metrics *admin.Metrics
	svc := service.New(d.Master, append([]service.Option{d.ServiceOption(), service.WithGate(lease), service.WithObserver(func(rpc string, dur time.Duration, err error) {
		metrics.Observe(rpc, dur, err)
	}), service.WithCRPC(crpc.ServerConfig{MaxFrame: cfg.RPCMaxMessageBytes, MaxCallsPerConn: cfg.CRPCMaxCallsPerConn,
		MaxCalls: cfg.CRPCMaxCalls, MaxBufferedBytes: cfg.CRPCMaxBufferedBytes, IdleTimeout: time.Duration(cfg.CRPCIdleTimeoutSec) * time.Second,
		Conns: netx.Config{Logger: log}}, netx.Config{Name: "master rpc port", Logger: log})}, cfg.sec.serviceOptions()...)...)
	metrics = admin.NewMetrics(d.Master, svc)
	treg := prometheus.NewRegistry() // this term's, for the admin handler's own /metrics (shadowed by the process's)
	logMetrics := oplog.NewCollector(d)
	treg.MustRegister(metrics, logMetrics)
	rpcAddr := net.JoinHostPort(cfg.RPCAddress, strconv.Itoa(cfg.RPCPort))
	lis, err := net.Listen("tcp", rpcAddr)
	if err != nil {
		return err
	}
	lead.set(cfg.sec.adminHandler(admin.Handler(d.Master, svc, treg, nil, append(adminOpts, admin.WithRole(lead.role))...)), metrics, logMetrics)
	defer lead.set(nil)
	log.Info("crescent-master serving", "rpc", lis.Addr().String(), "view_version", d.Master.ViewVersion())
	gopts := []grpc.ServerOption{grpc.MaxRecvMsgSize(cfg.RPCMaxMessageBytes), grpc.MaxSendMsgSize(cfg.RPCMaxMessageBytes)}
	if cfg.GRPCTuned {
		gopts = append(gopts, grpctune.ServerOptions()...)
	}
	err = svc.Serve(ctx, lis, gopts...)
	log.Info("crescent-master stopped serving")
	return err
}

// warmup is --ha_warmup_ms as the supervisor takes it (0 there: one TTL).
func warmup(cfg config, ttl time.Duration) time.Duration {
	if cfg.HAWarmupMs < 0 {
		return ttl
	}
	return max(time.Duration(cfg.HAWarmupMs)*time.Millisecond, time.Millisecond)
}
