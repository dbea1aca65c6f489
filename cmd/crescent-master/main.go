package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"gopkg.in/yaml.v3"

	"github.com/crescent-kv/crescent/engine/metadata/httpmeta"
	"github.com/crescent-kv/crescent/event"
	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/buildinfo"
	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/grpctune"
	"github.com/crescent-kv/crescent/internal/logx"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/admin"
	"github.com/crescent-kv/crescent/store/master/kvevents"
	"github.com/crescent-kv/crescent/store/master/service"
)

// config holds every setting, with the reference's flag names and
// defaults; YAML keys are the same names.
type config struct {
	RPCPort                     int     `yaml:"rpc_port"`
	RPCAddress                  string  `yaml:"rpc_address"`
	MetricsPort                 int     `yaml:"metrics_port"`
	DefaultKVLeaseTTL           int64   `yaml:"default_kv_lease_ttl"`    // ms
	DefaultKVSoftPinTTL         int64   `yaml:"default_kv_soft_pin_ttl"` // ms
	MaxKVSoftPinTTL             int64   `yaml:"max_kv_soft_pin_ttl"`     // ms
	AllowEvictSoftPinnedObjects bool    `yaml:"allow_evict_soft_pinned_objects"`
	EvictionRatio               float64 `yaml:"eviction_ratio"`
	EvictionHighWatermarkRatio  float64 `yaml:"eviction_high_watermark_ratio"`
	ClientTTL                   int64   `yaml:"client_ttl"` // s
	PutStartDiscardTimeoutSec   int64   `yaml:"put_start_discard_timeout_sec"`
	PutStartReleaseTimeoutSec   int64   `yaml:"put_start_release_timeout_sec"`
	AllocationStrategy          string  `yaml:"allocation_strategy"`
	RemoveByRegexBudgetMs       int64   `yaml:"remove_by_regex_budget_ms"`
	InvalidationTTLMs           int64   `yaml:"invalidation_ttl_ms"`
	MaxSegments                 int     `yaml:"max_segments"`
	MaxSegmentsPerClient        int     `yaml:"max_segments_per_client"`
	EnableHTTPMetadataServer    bool    `yaml:"enable_http_metadata_server"`
	HTTPMetadataServerPort      int     `yaml:"http_metadata_server_port"`
	HTTPMetadataServerHost      string  `yaml:"http_metadata_server_host"`
	RPCMaxMessageBytes          int     `yaml:"rpc_max_message_bytes"`
	CRPCMaxCallsPerConn         int     `yaml:"crpc_max_calls_per_conn"`
	CRPCMaxCalls                int     `yaml:"crpc_max_calls"`
	CRPCIdleTimeoutSec          int64   `yaml:"crpc_idle_timeout_sec"`
	CRPCMaxBufferedBytes        int64   `yaml:"crpc_max_buffered_bytes"`
	GRPCTuned                   bool    `yaml:"grpc_tuned"`

	EnableKVEvents           bool    `yaml:"enable_kv_events"`
	KVEventsEndpoint         string  `yaml:"kv_events_endpoint"`
	KVEventsReplayEndpoint   string  `yaml:"kv_events_replay_endpoint"`
	KVEventsTopic            string  `yaml:"kv_events_topic"`
	KVEventsEncoding         string  `yaml:"kv_events_encoding"`
	KVEventsQueueSize        int     `yaml:"kv_events_queue_size"`
	KVEventsBatchSize        int     `yaml:"kv_events_batch_size"`
	KVEventsBatchIntervalMs  float64 `yaml:"kv_events_batch_interval_ms"`
	KVEventsOverflow         string  `yaml:"kv_events_overflow"`
	KVEventsReplayBufferSize int     `yaml:"kv_events_replay_buffer_size"`

	// DataDir, when set, makes the master durable: its operation log
	// lives there and is replayed at start.
	DataDir string `yaml:"data_dir"`
	// OplogSyncers is the local log's LocalOptions.Syncers.
	OplogSyncers int `yaml:"oplog_syncers"`
	// Snapshots of a durable master (snapshots.go).
	SnapshotInterval time.Duration `yaml:"snapshot_interval"`
	SnapshotRetain   int           `yaml:"snapshot_retain"`
	SnapshotDir      string        `yaml:"snapshot_dir"`
	OplogRetain      int64         `yaml:"oplog_retain"`
	// SnapshotCatalog, when set (redis://...), keeps the snapshot catalog
	// in Redis instead of snapshot_dir.
	SnapshotCatalog string `yaml:"snapshot_catalog"`
	// Oplog, when set (etcd://h:p[,h2:p2]), keeps the operation log in
	// etcd under ClusterID instead.
	Oplog     string `yaml:"oplog"`
	ClusterID string `yaml:"cluster_id"`
	// OplogWriteTimeoutSec bounds the retries of one etcd write; past it
	// the log is failed (fail-stop).
	OplogWriteTimeoutSec int64 `yaml:"oplog_write_timeout_sec"`

	logx.Options `yaml:",inline"` // log_level, log_format

	haConfig `yaml:",inline"` // ha.go

	auth.FlagValues `yaml:",inline"` // token_file, tls_*, insecure: security.go
	sec             *security        // loaded by run
}

func defaults() config {
	return config{
		RPCPort: 50051, RPCAddress: "0.0.0.0", MetricsPort: 9003,
		DefaultKVLeaseTTL: 10000, DefaultKVSoftPinTTL: 30 * 60 * 1000, MaxKVSoftPinTTL: 24 * 3600 * 1000,
		AllowEvictSoftPinnedObjects: true, EvictionRatio: 0.05, EvictionHighWatermarkRatio: 0.90,
		ClientTTL: 10, PutStartDiscardTimeoutSec: 30, PutStartReleaseTimeoutSec: 600, RemoveByRegexBudgetMs: 5000,
		InvalidationTTLMs: 1000,
		MaxSegments:       master.DefaultMaxSegments, MaxSegmentsPerClient: master.DefaultMaxSegmentsPerClient,
		AllocationStrategy: "random", HTTPMetadataServerPort: 8080, HTTPMetadataServerHost: "0.0.0.0",
		KVEventsEndpoint: "tcp://*:5557", KVEventsReplayEndpoint: "tcp://*:5558", KVEventsEncoding: "map",
		KVEventsQueueSize: 100000, KVEventsBatchSize: 64, KVEventsBatchIntervalMs: 1, KVEventsOverflow: "drop_oldest",
		KVEventsReplayBufferSize: 10000, Options: logx.Options{LogLevel: "info", LogFormat: logx.FormatText}, ClusterID: "crescent", OplogWriteTimeoutSec: 30,
		RPCMaxMessageBytes: crpc.DefaultMaxFrame, CRPCMaxCallsPerConn: crpc.DefaultMaxCallsPerConn,
		CRPCMaxCalls: crpc.DefaultMaxCalls, CRPCIdleTimeoutSec: int64(crpc.DefaultIdleTimeout / time.Second),
		CRPCMaxBufferedBytes: crpc.DefaultMaxBuffered,
		haConfig:             haConfig{HALeaseTTLSec: 5, HAWarmupMs: 500},
		SnapshotInterval:     10 * time.Minute, SnapshotRetain: oplog.DefaultSnapshotRetain, OplogRetain: oplog.DefaultLogRetain, OplogSyncers: oplog.DefaultSyncers,
	}
}

// flags binds every setting to a flag of the same name.
func (c *config) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.RPCPort, "rpc_port", c.RPCPort, "RPC port: the master service over gRPC and, on the same port, crpc")
	fs.StringVar(&c.RPCAddress, "rpc_address", c.RPCAddress, "address the gRPC and admin ports listen on")
	fs.IntVar(&c.MetricsPort, "metrics_port", c.MetricsPort, "HTTP admin port: status page at /, /status.json, /metrics, /metrics/summary, /health, /query_key, /get_all_keys, /get_all_segments")
	fs.Int64Var(&c.DefaultKVLeaseTTL, "default_kv_lease_ttl", c.DefaultKVLeaseTTL, "read lease TTL, ms")
	fs.Int64Var(&c.DefaultKVSoftPinTTL, "default_kv_soft_pin_ttl", c.DefaultKVSoftPinTTL, "soft pin TTL, ms")
	fs.Int64Var(&c.MaxKVSoftPinTTL, "max_kv_soft_pin_ttl", c.MaxKVSoftPinTTL, "longest soft pin a put may ask for, ms")
	fs.BoolVar(&c.AllowEvictSoftPinnedObjects, "allow_evict_soft_pinned_objects", c.AllowEvictSoftPinnedObjects, "evict soft-pinned objects in a second pass when needed")
	fs.Float64Var(&c.EvictionRatio, "eviction_ratio", c.EvictionRatio, "share of capacity an eviction round frees")
	fs.Float64Var(&c.EvictionHighWatermarkRatio, "eviction_high_watermark_ratio", c.EvictionHighWatermarkRatio, "usage above which eviction runs")
	fs.Int64Var(&c.ClientTTL, "client_ttl", c.ClientTTL, "seconds without a heartbeat before a client's segments are dropped")
	fs.Int64Var(&c.InvalidationTTLMs, "invalidation_ttl_ms", c.InvalidationTTLMs, "ms a hot cache may serve after its last invalidation poll: the longest a remove waits for a silent cache")
	fs.IntVar(&c.MaxSegments, "max_segments", c.MaxSegments, "segments mounted in all; a mount past it is NO_AVAILABLE_HANDLE")
	fs.IntVar(&c.MaxSegmentsPerClient, "max_segments_per_client", c.MaxSegmentsPerClient, "segments one client may have mounted")
	fs.Int64Var(&c.PutStartDiscardTimeoutSec, "put_start_discard_timeout_sec", c.PutStartDiscardTimeoutSec, "seconds after which an unfinished put may be taken over")
	fs.Int64Var(&c.PutStartReleaseTimeoutSec, "put_start_release_timeout_sec", c.PutStartReleaseTimeoutSec, "seconds after which an unfinished put's space is freed")
	fs.StringVar(&c.AllocationStrategy, "allocation_strategy", c.AllocationStrategy, "random, free_ratio_first or local_first")
	fs.Int64Var(&c.RemoveByRegexBudgetMs, "remove_by_regex_budget_ms", c.RemoveByRegexBudgetMs, "longest one RemoveByRegex may run, ms (then it stops with RPC_TIMEOUT)")
	fs.BoolVar(&c.EnableHTTPMetadataServer, "enable_http_metadata_server", c.EnableHTTPMetadataServer, "serve the transfer engine's metadata (GET/PUT/DELETE /metadata?key=)")
	fs.IntVar(&c.HTTPMetadataServerPort, "http_metadata_server_port", c.HTTPMetadataServerPort, "port of the HTTP metadata server")
	fs.StringVar(&c.HTTPMetadataServerHost, "http_metadata_server_host", c.HTTPMetadataServerHost, "address of the HTTP metadata server")
	fs.IntVar(&c.RPCMaxMessageBytes, "rpc_max_message_bytes", c.RPCMaxMessageBytes, "largest RPC message either way, gRPC and crpc (batches of many keys need room)")
	fs.IntVar(&c.CRPCMaxCallsPerConn, "crpc_max_calls_per_conn", c.CRPCMaxCallsPerConn, "calls in flight per connection; at the bound crpc stops reading the connection until one ends, gRPC refuses more streams")
	fs.IntVar(&c.CRPCMaxCalls, "crpc_max_calls", c.CRPCMaxCalls, "calls in flight across connections (crpc; gRPC counted apart, answered RESOURCE_EXHAUSTED past it)")
	fs.Int64Var(&c.CRPCIdleTimeoutSec, "crpc_idle_timeout_sec", c.CRPCIdleTimeoutSec, "seconds a crpc connection may send nothing (clients ping every 10 s) before it is closed")
	fs.Int64Var(&c.CRPCMaxBufferedBytes, "crpc_max_buffered_bytes", c.CRPCMaxBufferedBytes, "request bytes held at once across connections, by crpc and by gRPC each (at least rpc_max_message_bytes)")
	fs.BoolVar(&c.GRPCTuned, "grpc_tuned", c.GRPCTuned, "serve gRPC with the tuned options (internal/grpctune: fixed windows, keepalive, worker pool, pooled codec) that --master_protocol grpc_tuned clients need")
	fs.BoolVar(&c.EnableKVEvents, "enable_kv_events", c.EnableKVEvents, "publish KV events (vLLM-compatible ZMQ stream)")
	fs.StringVar(&c.KVEventsEndpoint, "kv_events_endpoint", c.KVEventsEndpoint, "PUB endpoint (binds with *, ::, ipc://; else connects)")
	fs.StringVar(&c.KVEventsReplayEndpoint, "kv_events_replay_endpoint", c.KVEventsReplayEndpoint, "ROUTER replay endpoint; empty = no replay")
	fs.StringVar(&c.KVEventsTopic, "kv_events_topic", c.KVEventsTopic, "topic frame of every message")
	fs.StringVar(&c.KVEventsEncoding, "kv_events_encoding", c.KVEventsEncoding, "map (vLLM >= 0.26) or array (older consumers)")
	fs.IntVar(&c.KVEventsQueueSize, "kv_events_queue_size", c.KVEventsQueueSize, "events queued before the overflow policy applies")
	fs.IntVar(&c.KVEventsBatchSize, "kv_events_batch_size", c.KVEventsBatchSize, "most events per batch")
	fs.Float64Var(&c.KVEventsBatchIntervalMs, "kv_events_batch_interval_ms", c.KVEventsBatchIntervalMs, "longest wait before a partial batch is sent, ms")
	fs.StringVar(&c.KVEventsOverflow, "kv_events_overflow", c.KVEventsOverflow, "drop_oldest (puts never wait; subscribers see the loss as a sequence gap) or block (lossless, event.Publisher's default; puts wait for room)")
	fs.IntVar(&c.KVEventsReplayBufferSize, "kv_events_replay_buffer_size", c.KVEventsReplayBufferSize, "batches kept for replay")
	fs.StringVar(&c.DataDir, "data_dir", c.DataDir, "directory of the operation log: every change is durable there before it is acknowledged, and a restart replays it (empty: state in memory only)")
	c.snapshotFlags(fs)
	fs.StringVar(&c.Oplog, "oplog", c.Oplog, "etcd://host:port[,host:port]: keep the operation log in etcd (under cluster_id) instead of --data_dir; every change is durable there before it is acknowledged")
	fs.StringVar(&c.ClusterID, "cluster_id", c.ClusterID, "name of this master's cluster: the etcd operation log lives under crescent/oplog/<cluster_id>/")
	fs.Int64Var(&c.OplogWriteTimeoutSec, "oplog_write_timeout_sec", c.OplogWriteTimeoutSec, "--oplog etcd: seconds one write may keep failing before the log is failed and the master stops acknowledging (fail-stop)")
	c.Options.Register(fs)
	c.haFlags(fs)
	c.securityFlags(fs)
}

// load reads defaults, then the YAML file, then the flags given on the
// command line (which win).
func load(args []string) (config, error) {
	c := defaults()
	fs, path, version := flagSet(&c)
	if err := fs.Parse(args); err != nil {
		return c, err // flag.ErrHelp: main prints the usage
	}
	if *version {
		return c, errVersion
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (settings are flags, or keys of --config)", fs.Arg(0))
	}
	if *path == "" {
		return c, c.validate()
	}
	b, err := os.ReadFile(*path)
	if err != nil {
		return c, fmt.Errorf("--config: %w", err)
	}
	fromFile := defaults()
	if err := decodeYAML(b, &fromFile); err != nil {
		return c, fmt.Errorf("--config %s: %w", *path, err)
	}
	// Re-apply the command line on top of the file.
	fs2, _, _ := flagSet(&fromFile)
	var set []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "config" && f.Name != "version" {
			set = append(set, "--"+f.Name+"="+f.Value.String())
		}
	})
	if err := fs2.Parse(set); err != nil {
		return c, err
	}
	return fromFile, fromFile.validate()
}

// errVersion: --version was given.
var errVersion = errors.New("version requested")

// flagSet is the command line: --config, --version and every setting. It
// prints nothing: main words errors in one line, and the usage on -h.
func flagSet(c *config) (fs *flag.FlagSet, path *string, version *bool) {
	fs = flag.NewFlagSet("crescent-master", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path = fs.String("config", "", "YAML file with any of these settings (flags given on the command line win); an unknown key is an error")
	version = fs.Bool("version", false, "print the version and exit")
	c.flags(fs)
	return fs, path, version
}

// yamlUnknown is yaml.v3's wording for a key the struct lacks.
var yamlUnknown = regexp.MustCompile(`field (\S+) not found in type \S+`)

// decodeYAML reads one YAML document into c, refusing keys that are not
// settings (a typo would otherwise fall back to the default silently).
func decodeYAML(b []byte, c *config) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	err := dec.Decode(c)
	if errors.Is(err, io.EOF) {
		return nil // empty file: the defaults
	}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, m := range te.Errors {
			msgs[i] = yamlUnknown.ReplaceAllString(m, "unknown key $1")
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	if err != nil {
		return err
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("more than one YAML document")
	}
	return nil
}

func (c *config) validate() error {
	if err := c.validateStrict(); err != nil {
		return err
	}
	switch {
	case c.RPCPort < 0 || c.RPCPort > 65535:
		return fmt.Errorf("rpc_port %d out of range", c.RPCPort)
	case c.MetricsPort < 0 || c.MetricsPort > 65535:
		return fmt.Errorf("metrics_port %d out of range", c.MetricsPort)
	case c.EvictionRatio <= 0 || c.EvictionRatio > 1:
		return fmt.Errorf("eviction_ratio %v not in (0, 1]", c.EvictionRatio)
	case c.EvictionHighWatermarkRatio <= 0 || c.EvictionHighWatermarkRatio > 1:
		return fmt.Errorf("eviction_high_watermark_ratio %v not in (0, 1]", c.EvictionHighWatermarkRatio)
	case c.MaxSegments < 1 || c.MaxSegmentsPerClient < 1:
		return errors.New("max_segments and max_segments_per_client must be positive")
	case c.DefaultKVLeaseTTL <= 0 || c.ClientTTL <= 0 || c.RemoveByRegexBudgetMs <= 0 || c.InvalidationTTLMs <= 0:
		return errors.New("default_kv_lease_ttl, client_ttl, remove_by_regex_budget_ms and invalidation_ttl_ms must be positive")
	case c.RPCMaxMessageBytes < 1<<20 || c.RPCMaxMessageBytes > 1<<30:
		return fmt.Errorf("rpc_max_message_bytes %d not in [1 MiB, 1 GiB]", c.RPCMaxMessageBytes)
	case c.CRPCMaxBufferedBytes < int64(c.RPCMaxMessageBytes):
		return fmt.Errorf("crpc_max_buffered_bytes %d < rpc_max_message_bytes %d", c.CRPCMaxBufferedBytes, c.RPCMaxMessageBytes)
	case c.CRPCMaxCallsPerConn < 1 || c.CRPCMaxCalls < 1 || c.CRPCIdleTimeoutSec < 1:
		return errors.New("crpc_max_calls_per_conn, crpc_max_calls and crpc_idle_timeout_sec must be positive")
	}
	if _, err := alloc.ParseStrategy(c.AllocationStrategy); err != nil {
		return err
	}
	if c.Oplog != "" {
		// One log: two would each hold half the history.
		if c.DataDir != "" {
			return errors.New("data_dir and oplog are exclusive: the operation log is either local files or etcd")
		}
		if _, err := oplog.ParseEtcdURL(c.Oplog); err != nil {
			return err
		}
		if c.ClusterID == "" || strings.Contains(c.ClusterID, "/") {
			return fmt.Errorf("cluster_id %q: must be non-empty, without '/'", c.ClusterID)
		}
		if c.OplogWriteTimeoutSec < 1 {
			return fmt.Errorf("oplog_write_timeout_sec %d must be positive", c.OplogWriteTimeoutSec)
		}
	}
	if err := c.validateHA(); err != nil {
		return err
	}
	if _, err := loadSecurity(c.FlagValues, nil); err != nil {
		return err
	}
	return c.validateSnapshots()
}

// validateStrict refuses what run would otherwise rewrite or ignore.
func (c *config) validateStrict() error {
	if se, ok := c.Options.Validate().(*logx.SettingError); ok {
		return errors.New(se.KeyError()) // a setting: flag or YAML key
	}
	if _, err := event.ParseEncoding(c.KVEventsEncoding); err != nil {
		return fmt.Errorf("kv_events_encoding %q: want map or array", c.KVEventsEncoding)
	}
	switch {
	case c.KVEventsOverflow != "drop_oldest" && c.KVEventsOverflow != "block":
		return fmt.Errorf("kv_events_overflow %q: want drop_oldest or block", c.KVEventsOverflow)
	case c.KVEventsQueueSize < 1 || c.KVEventsBatchSize < 1 || c.KVEventsReplayBufferSize < 1:
		return fmt.Errorf("kv_events_queue_size %d, kv_events_batch_size %d, kv_events_replay_buffer_size %d: each must be at least 1",
			c.KVEventsQueueSize, c.KVEventsBatchSize, c.KVEventsReplayBufferSize)
	case c.KVEventsBatchIntervalMs < 0:
		return fmt.Errorf("kv_events_batch_interval_ms %v: must not be negative", c.KVEventsBatchIntervalMs)
	case c.DefaultKVSoftPinTTL < 0 || c.MaxKVSoftPinTTL < 0:
		return errors.New("default_kv_soft_pin_ttl and max_kv_soft_pin_ttl must not be negative")
	case c.PutStartDiscardTimeoutSec < 0 || c.PutStartReleaseTimeoutSec < 0:
		return errors.New("put_start_discard_timeout_sec and put_start_release_timeout_sec must not be negative")
	case c.HTTPMetadataServerPort < 0 || c.HTTPMetadataServerPort > 65535:
		return fmt.Errorf("http_metadata_server_port %d out of range", c.HTTPMetadataServerPort)
	case c.MetricsPort != 0 && c.MetricsPort == c.RPCPort:
		return fmt.Errorf("rpc_port and metrics_port are both %d", c.RPCPort)
	case c.EnableHTTPMetadataServer && c.HTTPMetadataServerPort != 0 && (c.HTTPMetadataServerPort == c.RPCPort || c.HTTPMetadataServerPort == c.MetricsPort):
		return fmt.Errorf("http_metadata_server_port %d is taken by rpc_port or metrics_port", c.HTTPMetadataServerPort)
	}
	for _, a := range []struct{ key, host string }{{"rpc_address", c.RPCAddress}, {"http_metadata_server_host", c.HTTPMetadataServerHost}} {
		if a.host == "" || net.ParseIP(a.host) != nil {
			continue
		}
		if _, err := net.LookupHost(a.host); err != nil {
			return fmt.Errorf("%s %q does not resolve: %w", a.key, a.host, err)
		}
	}
	return nil
}

func usage(w io.Writer) {
	c := defaults()
	fs, _, _ := flagSet(&c)
	fmt.Fprintln(w, "usage: crescent-master [flags]\n\nEvery flag is also a key of the --config YAML file.\nExit codes: 0 ok (also after SIGTERM), 1 error, 2 bad flag or config.\n\nflags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

func main() {
	cfg, err := load(os.Args[1:])
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage(os.Stderr)
		return
	case errors.Is(err, errVersion):
		fmt.Println(buildinfo.Line("crescent-master"))
		return
	case err != nil:
		fmt.Fprintln(os.Stderr, "crescent-master:", strings.ReplaceAll(err.Error(), "\n", "; "))
		os.Exit(2)
	}
	setGlobalLog = true
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "crescent-master:", explainListen(cfg, err))
		os.Exit(1)
	}
}

// explainListen names the flags of an address run could not listen on.
func explainListen(cfg config, err error) error {
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "listen" || oe.Addr == nil {
		return err
	}
	flags := "--rpc_address/--rpc_port"
	if _, port, _ := net.SplitHostPort(oe.Addr.String()); port != "" {
		switch port {
		case strconv.Itoa(cfg.RPCPort):
		case strconv.Itoa(cfg.MetricsPort):
			flags = "--rpc_address/--metrics_port"
		case strconv.Itoa(cfg.HTTPMetadataServerPort):
			flags = "--http_metadata_server_host/--http_metadata_server_port"
		}
	}
	return fmt.Errorf("%s: cannot listen on %s: %w", flags, oe.Addr, oe.Err)
}

// setGlobalLog: run installs its logger as the process's (main only:
// tests run masters in their own process).
var setGlobalLog bool

func run(ctx context.Context, cfg config) error {
	log := cfg.Options.New(os.Stderr)
	if setGlobalLog {
		logx.SetGlobal(log) // libraries defaulting to slog.Default(), and gRPC, log as run does
	}
	strategy, _ := alloc.ParseStrategy(cfg.AllocationStrategy)
	mc := master.Config{
		LeaseTTL:              time.Duration(cfg.DefaultKVLeaseTTL) * time.Millisecond,
		SoftPinTTL:            time.Duration(cfg.DefaultKVSoftPinTTL) * time.Millisecond,
		MaxSoftPinTTL:         time.Duration(cfg.MaxKVSoftPinTTL) * time.Millisecond,
		KeepSoftPinned:        !cfg.AllowEvictSoftPinnedObjects,
		EvictionHighWatermark: cfg.EvictionHighWatermarkRatio,
		EvictionRatio:         cfg.EvictionRatio,
		ClientTTL:             time.Duration(cfg.ClientTTL) * time.Second,
		PutDiscardTimeout:     time.Duration(cfg.PutStartDiscardTimeoutSec) * time.Second,
		PutReleaseTimeout:     time.Duration(cfg.PutStartReleaseTimeoutSec) * time.Second,
		RegexBudget:           time.Duration(cfg.RemoveByRegexBudgetMs) * time.Millisecond,
		InvalidationTTL:       time.Duration(cfg.InvalidationTTLMs) * time.Millisecond,
		MaxSegments:           cfg.MaxSegments,
		MaxSegmentsPerClient:  cfg.MaxSegmentsPerClient,
		Strategy:              strategy,
		Logger:                log,
	}

	sec, err := loadSecurity(cfg.FlagValues, log)
	if err != nil {
		return err
	}
	cfg.sec = sec
	cfg.sec.logLine()
	var pub *event.Publisher
	if cfg.EnableKVEvents {
		if pub, err = newPublisher(cfg, log); err != nil {
			return err
		}
		mc.Events = kvevents.New(pub)
		log.Info("publishing KV events", "endpoint", pub.Endpoint(), "replay", pub.ReplayEndpoint(), "topic", cfg.KVEventsTopic)
	}
	if cfg.HABackend != "" {
		return runHA(ctx, cfg, mc, pub, log)
	}

	var (
		m          *master.Master
		svcOpts    []service.Option
		logMetrics prometheus.Collector
	)
	var adminOpts []admin.Option
	var snaps *snapshots
	if cfg.DataDir != "" || cfg.Oplog != "" {
		var recovery []oplog.DurableOption
		if cfg.DataDir != "" || cfg.SnapshotDir != "" {
			if snaps, err = openSnapshots(cfg, log); err != nil {
				return err
			}
			defer snaps.close()
			recovery = snaps.recovery()
		}
		d, err := openLog(ctx, cfg, mc, log, recovery...)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := d.Close(); cerr != nil {
				log.Error("closing the operation log", "err", cerr)
			}
		}()
		log.Info("recovered from the operation log", "data_dir", cfg.DataDir, "oplog", cfg.Oplog, "snapshot", d.Snapshot.ID,
			"snapshot_seq", d.Snapshot.Seq, "entries", d.Replayed, "took", d.Took)
		m, svcOpts, logMetrics = d.Master, []service.Option{d.ServiceOption()}, oplog.NewCollector(d)
		if snaps != nil {
			if adminOpts, err = snaps.start(cfg, d, mc); err != nil {
				return err
			}
			defer snaps.stop() // before the log closes
		}
	} else if m, err = master.New(mc); err != nil {
		return err
	}
	if err := m.Start(); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var metrics *admin.Metrics
	svcOpts = append(svcOpts, cfg.sec.serviceOptions()...)
	svc := service.New(m, append(svcOpts, service.WithObserver(func(rpc string, d time.Duration, err error) {
		metrics.Observe(rpc, d, err)
	}), service.WithCRPC(crpc.ServerConfig{MaxFrame: cfg.RPCMaxMessageBytes, MaxCallsPerConn: cfg.CRPCMaxCallsPerConn,
		MaxCalls: cfg.CRPCMaxCalls, MaxBufferedBytes: cfg.CRPCMaxBufferedBytes, IdleTimeout: time.Duration(cfg.CRPCIdleTimeoutSec) * time.Second,
		Conns: netx.Config{Logger: log}}, netx.Config{Name: "master rpc port", Logger: log}))...)
	metrics = admin.NewMetrics(m, svc)
	reg.MustRegister(metrics)
	if logMetrics != nil {
		reg.MustRegister(logMetrics)
	}
	if snaps != nil {
		reg.MustRegister(snaps.metrics.collectors()...)
	}
	if pub != nil {
		reg.MustRegister(pub.Collector())
	}

	rpcAddr := net.JoinHostPort(cfg.RPCAddress, strconv.Itoa(cfg.RPCPort))
	lis, err := net.Listen("tcp", rpcAddr)
	if err != nil {
		m.Close()
		return err
	}
	servers := &httpServers{log: log, sec: cfg.sec}
	serve := servers.serve
	if cfg.MetricsPort > 0 {
		if err := serve(net.JoinHostPort(cfg.RPCAddress, strconv.Itoa(cfg.MetricsPort)), cfg.sec.adminHandler(admin.Handler(m, svc, reg, nil, adminOpts...))); err != nil {
			lis.Close()
			m.Close()
			return err
		}
	}
	if cfg.EnableHTTPMetadataServer {
		mux := http.NewServeMux()
		mux.Handle("/metadata", httpmeta.Handler())
		if err := servers.serveMetadata(net.JoinHostPort(cfg.HTTPMetadataServerHost, strconv.Itoa(cfg.HTTPMetadataServerPort)), mux); err != nil {
			lis.Close()
			m.Close()
			return err
		}
	}
	log.Info("crescent-master serving", "rpc", lis.Addr().String(), "view_version", m.ViewVersion())
	// Batch RPCs of many keys exceed gRPC's 4 MiB default.
	gopts := []grpc.ServerOption{grpc.MaxRecvMsgSize(cfg.RPCMaxMessageBytes), grpc.MaxSendMsgSize(cfg.RPCMaxMessageBytes)}
	if cfg.GRPCTuned {
		gopts = append(gopts, grpctune.ServerOptions()...)
	}
	err = svc.Serve(ctx, lis, gopts...)
	log.Info("crescent-master stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	servers.shutdown(sctx)
	m.Close()
	if pub != nil {
		if perr := pub.Close(sctx); perr != nil {
			log.Warn("kv events not all delivered", "err", perr)
		}
	}
	return err
}

func newPublisher(cfg config, log *slog.Logger) (*event.Publisher, error) {
	enc, err := event.ParseEncoding(cfg.KVEventsEncoding)
	if err != nil {
		return nil, err
	}
	pc := event.PublisherConfig{
		Endpoint:       cfg.KVEventsEndpoint,
		ReplayEndpoint: cfg.KVEventsReplayEndpoint,
		Topic:          cfg.KVEventsTopic,
		Encoding:       enc,
		QueueSize:      cfg.KVEventsQueueSize,
		MaxBatchEvents: cfg.KVEventsBatchSize,
		FlushInterval:  time.Duration(cfg.KVEventsBatchIntervalMs * float64(time.Millisecond)),
		ReplayBuffer:   cfg.KVEventsReplayBufferSize,
		Logger:         log,
		// The protected default covers the event ports too; ZMQ
		// subscribers (vLLM's) cannot authenticate, so with a credential
		// they stay open (read-only: key names and block hashes).
		Allow: cfg.sec.mode.Allow(),
	}
	switch cfg.KVEventsOverflow {
	case "drop_oldest", "":
		pc.Overflow = event.DropOldest
	case "block":
		pc.Overflow = event.Block
	default:
		return nil, fmt.Errorf("kv_events_overflow %q: want drop_oldest or block", cfg.KVEventsOverflow)
	}
	return event.NewPublisher(pc)
}
