package bench

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// Defaults of StoreConfig.
const (
	DefaultStoreClients     = 2
	DefaultStoreSegmentSize = 512 << 20
	DefaultStoreStaging     = 64 << 20
	DefaultStoreValueSize   = 1 << 20
	DefaultStoreThreads     = 2
	DefaultMetaObjects      = 1_000_000
	DefaultMetaBatch        = 128
)

// Shares of the pool's memory the bench fills, below the master's
// eviction watermark (0.90) with room for the allocator's size classes
// (up to 12.5%), so no key is evicted during a run.
const (
	getShare      = 0.70 // get: the keys read
	mixedGetShare = 0.40 // mixed: the keys read ...
	mixedPutShare = 0.30 // ... and the keys written
	putShare      = 0.70 // put: the keys written
	aheadShare    = 0.85 // put: the keys written and the reservations held
	maxGetKeys    = 16384
	maxRingKeys   = 1024
)

// StoreConfig configures the store benchmark (RunStore).
type StoreConfig struct {
	// MasterAddr is an existing master ("host:port"); empty starts one in
	// this process on a loopback port.
	MasterAddr string `json:"master_addr,omitempty"`
	// Clients is the number of store clients (default 2), each
	// contributing SegmentSize bytes and running Threads workers.
	Clients int `json:"clients"`
	// ClientProcesses runs each client in its own process: ClientCommand
	// (with ClientEnv added to the environment) must serve
	// ServeStoreClient on its stdin and stdout.
	ClientProcesses bool     `json:"client_processes,omitempty"`
	ClientCommand   []string `json:"-"`
	ClientEnv       []string `json:"-"`
	// SegmentSize is the memory each client contributes (default 512 MiB).
	SegmentSize int64 `json:"segment_size"`
	// LocalBufferSize is each client's staging pool (default 64 MiB).
	LocalBufferSize int64 `json:"local_buffer_size"`
	// ValueSize is the bytes per value (default 1 MiB).
	ValueSize int `json:"value_size"`
	// Operation: put, get (default), mixed, or meta (metadata only:
	// BatchPutStart+BatchPutEnd of Objects objects through gRPC).
	Operation string `json:"operation"`
	// GetRatio is the share of gets in mixed (0 = 0.5).
	GetRatio float64 `json:"get_ratio,omitempty"`
	// Duration measured (default 10 s), in rounds of about a second
	// alternating with the baseline; Warmup before (default 1 s,
	// negative = none).
	Duration time.Duration `json:"duration"`
	Warmup   time.Duration `json:"warmup"`
	// Threads is the number of concurrent workers per client (default 2).
	Threads int `json:"threads"`
	// Protocol is the one engine transport to use; empty leaves the
	// engine's preference order (shm first on one host).
	Protocol string `json:"protocol,omitempty"`
	// Replicas per value (default 1).
	Replicas int `json:"replicas"`
	// Batch is the keys per call: BatchPut/BatchGet when > 1 (default 1;
	// meta: 128).
	Batch int `json:"batch"`
	// Staged uses Put/Get (BatchPut/BatchGet) on Go heap memory, moved
	// through the client's staging pool. By default values come from and
	// go to buffers registered with RegisterBuffer, through PutFrom and
	// GetInto (BatchPut, BatchGetInto), with no copy in user space.
	Staged bool `json:"staged,omitempty"`
	// Baseline is "redis" (SET/GET through go-redis on a redis-server the
	// bench starts), "none", or empty for redis when it is installed.
	Baseline string `json:"baseline,omitempty"`
	// RedisServer is the redis-server binary (default: $PATH).
	RedisServer string `json:"redis_server,omitempty"`
	// LocalHostname is the clients' engine host (default 127.0.0.1).
	LocalHostname string `json:"local_hostname,omitempty"`
	// PutAhead is the clients' Config.PutAhead: reservations kept per
	// value size for one-round-trip puts (0 = the client's default,
	// negative = off: every put is PutStart+PutEnd).
	PutAhead int `json:"put_ahead,omitempty"`
	// PutAheadBytes is the clients' Config.PutAheadBytes, the pool
	// memory each client's reservations may hold (0 = the client's
	// default); put runs leave room for it in the segments.
	PutAheadBytes int64 `json:"put_ahead_bytes,omitempty"`
	// LocationCache is the clients' Config.LocationCache: locations of
	// up to that many objects cached, so a repeated get asks the master
	// nothing (0 = off).
	LocationCache int `json:"location_cache,omitempty"`
	// MasterProtocol is the clients' Config.MasterProtocol: auto
	// (default: crpc, the master's light framing, when it answers), crpc,
	// grpc, grpc_tuned (the in-process master then serves gRPC with
	// grpctune.ServerOptions) or drpc (in-process master only,
	// served on its own port).
	MasterProtocol string `json:"master_protocol,omitempty"`
	// Objects is the number of objects meta stores (default 1,000,000).
	Objects int `json:"objects,omitempty"`
	// Oplog is the in-process master's operation log: off (default),
	// local (files in OplogDir, default a temporary directory in the
	// working directory), etcd (a single-member etcd the bench starts,
	// data on disk in a temporary directory in OplogDir or the working
	// directory, fsync on) or etcd://host:port[,host:port] (an external
	// one). With the log on, the default baseline is "oplog_off".
	Oplog    string `json:"oplog,omitempty"`
	OplogDir string `json:"oplog_dir,omitempty"`
	// TLS serves the in-process master's RPC port over TLS with client
	// certificates (mTLS) and the clients use it; the default baseline is
	// then "tls_off" (the same run without TLS), so the ratio is TLS's
	// cost. In-process master and clients only.
	TLS bool      `json:"tls,omitempty"`
	tls *benchTLS // the run's certificates
	// Progress, when set, receives a line per round.
	Progress io.Writer `json:"-"`
	// Logger for the clients (nil: slog.Default(); crescent-bench sets
	// that to warn on stderr, --log_level).
	Logger *slog.Logger `json:"-"`
}

// Errors of the store benchmark's configuration.
var ErrStoreConfig = errors.New("bench: invalid store configuration")

func (c *StoreConfig) setDefaults() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: %s", ErrStoreConfig, fmt.Sprintf(f, a...)) }
	c.Operation = cmp.Or(c.Operation, "get")
	switch c.Operation {
	case "put", "get", "mixed", "meta":
	default:
		return bad("--operation must be put, get, mixed or meta, not %q", c.Operation)
	}
	c.Clients = cmp.Or(c.Clients, DefaultStoreClients)
	c.Threads = cmp.Or(c.Threads, DefaultStoreThreads)
	c.SegmentSize = cmp.Or(c.SegmentSize, DefaultStoreSegmentSize)
	c.LocalBufferSize = cmp.Or(c.LocalBufferSize, DefaultStoreStaging)
	c.ValueSize = cmp.Or(c.ValueSize, DefaultStoreValueSize)
	c.Replicas = cmp.Or(c.Replicas, 1)
	if c.Batch == 0 {
		c.Batch = 1
		if c.Operation == "meta" {
			c.Batch = DefaultMetaBatch
		}
	}
	c.GetRatio = cmp.Or(c.GetRatio, 0.5)
	c.Duration = cmp.Or(c.Duration, 10*time.Second)
	c.Warmup = cmp.Or(c.Warmup, time.Second)
	c.LocalHostname = cmp.Or(c.LocalHostname, "127.0.0.1")
	c.Objects = cmp.Or(c.Objects, DefaultMetaObjects)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch c.MasterProtocol {
	case "", "auto", LayerCRPC, LayerGRPC, LayerGRPCTuned:
	case LayerDRPC:
		if c.MasterAddr != "" {
			return bad("--master_protocol drpc needs the in-process master (crescent-master does not serve drpc)")
		}
	default:
		return bad("--master_protocol must be auto, crpc, grpc, grpc_tuned or drpc, not %q", c.MasterProtocol)
	}
	switch {
	case c.Clients < 1 || c.Clients > 64:
		return bad("--clients %d outside [1, 64]", c.Clients)
	case c.Threads < 1 || c.Threads > 1024:
		return bad("--threads %d outside [1, 1024]", c.Threads)
	case c.SegmentSize < 0, c.LocalBufferSize < 0, c.PutAheadBytes < 0:
		return bad("negative memory size")
	case c.ValueSize < 1:
		return bad("--value_size %d", c.ValueSize)
	case c.Replicas < 1 || c.Replicas > 16:
		return bad("--replicas %d outside [1, 16]", c.Replicas)
	case c.Batch < 1 || c.Batch > 4096:
		return bad("--batch %d outside [1, 4096]", c.Batch)
	case !(c.GetRatio > 0 && c.GetRatio <= 1):
		return bad("--get_ratio %v outside (0, 1]", c.GetRatio)
	case c.Duration < 0:
		return bad("negative --duration")
	case c.Objects < 1:
		return bad("--objects %d", c.Objects)
	case c.ClientProcesses && len(c.ClientCommand) == 0:
		return bad("client processes need a ClientCommand")
	}
	if err := c.checkOplog(); err != nil {
		return err
	}
	if c.TLS {
		switch {
		case c.MasterAddr != "":
			return bad("--tls measures the in-process master: not with --master")
		case c.ClientProcesses:
			return bad("--tls: in-process clients only (not --client_processes)")
		case c.MasterProtocol == LayerDRPC:
			return bad("--tls: crpc or gRPC, not drpc")
		}
		if c.Baseline == "" {
			c.Baseline = BaselineTLSOff
		}
		kit, err := newBenchTLS()
		if err != nil {
			return err
		}
		c.tls = kit
	}
	switch c.Baseline {
	case BaselineTLSOff:
		if !c.TLS {
			return bad("--baseline tls_off needs --tls")
		}
	case "":
		c.Baseline = "none"
		if c.Oplog != OplogOff {
			c.Baseline = BaselineOplogOff
		} else if c.Operation != "meta" && RedisAvailable(c.RedisServer) {
			c.Baseline = "redis"
		}
	case "redis", "none":
	case BaselineEngine:
		switch {
		case c.Operation == "meta":
			return bad("--baseline engine moves values: not with --operation meta")
		case c.Staged:
			return bad("--baseline engine moves registered buffers: not with --zero_copy=false")
		}
	case BaselineOplogOff:
		if c.Oplog == OplogOff {
			return bad("--baseline oplog_off needs --oplog")
		}
	default:
		return bad("--baseline must be redis, engine, oplog_off, tls_off or none, not %q", c.Baseline)
	}
	if c.Operation == "meta" && c.Baseline == "redis" {
		c.Baseline = "none"
	}
	return nil
}

// StoreResult is one run's outcome. Ops count keys (objects): a batched
// call of N keys is N ops. Latencies are per call. Throughputs are in
// GB/s (1e9 bytes).
type StoreResult struct {
	Operation       string `json:"operation"`
	ValueSize       int    `json:"value_size"`
	Clients         int    `json:"clients"`
	ClientProcesses bool   `json:"client_processes"`
	Threads         int    `json:"threads"`
	Batch           int    `json:"batch"`
	Replicas        int    `json:"replicas"`
	// ReplicasStoredMin and Max are the fewest and most replicas a put
	// of the run stored (prepare included); UnderReplicatedPuts the puts
	// that stored fewer than Replicas.
	ReplicasStoredMin   int   `json:"replicas_stored_min"`
	ReplicasStoredMax   int   `json:"replicas_stored_max"`
	UnderReplicatedPuts int64 `json:"under_replicated_puts"`
	// PutAhead as configured (0 = the client's default, negative = off)
	// and the reservations' byte budget per client (the default filled
	// in).
	PutAhead      int   `json:"put_ahead"`
	PutAheadBytes int64 `json:"put_ahead_bytes"`
	// PutsAheadShare is the share of the clients' puts (prepare included)
	// committed on a reservation held ahead, in one round trip; the rest
	// took PutStart and PutEnd.
	PutsAheadShare float64 `json:"puts_ahead_share"`
	// LocationCache as configured and the share of the clients' gets
	// (prepare included) read from a cached location.
	LocationCache    int     `json:"location_cache,omitempty"`
	LocationHitShare float64 `json:"location_hit_share,omitempty"`
	// MasterProtocol the clients used: crpc or grpc.
	MasterProtocol string `json:"master_protocol"`
	// ZeroCopy: every call moved values with no copy in user space.
	ZeroCopy       bool    `json:"zero_copy"`
	Protocol       string  `json:"protocol"`
	DurationS      float64 `json:"duration_s"`
	Ops            int64   `json:"ops"`
	Gets           int64   `json:"gets"`
	Puts           int64   `json:"puts"`
	Bytes          int64   `json:"bytes"`
	OpsPerSec      float64 `json:"ops_per_sec"`
	ThroughputGBps float64 `json:"throughput_gbps"`
	P50us          float64 `json:"p50_us"`
	P99us          float64 `json:"p99_us"`
	P999us         float64 `json:"p999_us"`
	// GetKeys is the keys each client populated and reads; RingKeys the
	// keys each put worker cycles through (removing them all with one
	// BatchRemove each time round).
	GetKeys  int `json:"get_keys"`
	RingKeys int `json:"ring_keys"`
	// Baseline is "redis", "oplog_off" (a master with the log off, the
	// same clients and workers) or "none", measured in the same run,
	// interleaved in rounds.
	Baseline          string  `json:"baseline"`
	BaselineOpsPerSec float64 `json:"baseline_ops_per_sec"`
	BaselineGBps      float64 `json:"baseline_gbps"`
	BaselineP50us     float64 `json:"baseline_p50_us"`
	BaselineP99us     float64 `json:"baseline_p99_us"`
	BaselineP999us    float64 `json:"baseline_p999_us"`
	// Ratio is ThroughputGBps / BaselineGBps (ops for meta; 0 without a
	// baseline).
	Ratio float64 `json:"ratio"`
	// Oplog is the master's operation log: off, local, etcd, etcd://...,
	// or "external" for a master given by address.
	Oplog string `json:"oplog"`
	// OplogBytesPerPut is the local log's record bytes per put measured
	// (every op of the run, removes and reservations included).
	OplogBytesPerPut float64 `json:"oplog_bytes_per_put,omitempty"`
	// OplogCommitsPerSec and OplogEntriesPerCommit describe the log's
	// group commit during the measurement (one fsync or etcd transaction
	// per commit; the baseline's rounds fall in between).
	OplogCommitsPerSec    float64 `json:"oplog_commits_per_sec,omitempty"`
	OplogEntriesPerCommit float64 `json:"oplog_entries_per_commit,omitempty"`
	// OplogFsyncUs is the local log's mean fdatasync time in the run.
	OplogFsyncUs float64 `json:"oplog_fsync_us,omitempty"`
	// OplogDurableWaitUs is how long the master's answers waited on
	// average for the log to make their changes durable (the log's share
	// of a call's latency, measured in the master).
	OplogDurableWaitUs float64 `json:"oplog_durable_wait_us,omitempty"`
	// OplogWaits splits that wait by RPC, the longest total first: a
	// put's own commit (commit_put) against the bench's ring removals
	// (batch_remove), for instance.
	OplogWaits []OplogWait `json:"oplog_waits,omitempty"`
	// EvictedKeys during the measurement (in-process master only).
	EvictedKeys *uint64 `json:"evicted_keys,omitempty"`
	// Master is the master's address ("in-process" when started here).
	Master string `json:"master"`
}

// storePlan is what each client needs to prepare: everyone's segment
// names (to place its values on the others) and the key counts.
type storePlan struct {
	RunID string   `json:"run_id"`
	Peers []string `json:"peers"`
	// PeerBufs[i] is the address of client i's value buffers (the engine
	// baseline's targets).
	PeerBufs []uint64 `json:"peer_bufs,omitempty"`
	GetKeys  int      `json:"get_keys"`
	Ring     int      `json:"ring"`
}

func getKey(run string, client, i int) string {
	return "crescent-bench/" + run + "/c" + strconv.Itoa(client) + "/g" + strconv.Itoa(i)
}

func ringKey(run string, client, worker, i int) string {
	return "crescent-bench/" + run + "/c" + strconv.Itoa(client) + "/w" + strconv.Itoa(worker) + "/p" + strconv.Itoa(i)
}

// reserved estimates what the master reserves for one value: the
// allocator rounds to 64 bytes and then to a size class (<= 12.5% more).
func reserved(n int) int64 { return int64(n) + int64(n)/8 + 64 }

// aheadBytes is the put-ahead budget of each client (0 with it off).
func (c *StoreConfig) aheadBytes() int64 {
	if c.PutAhead < 0 {
		return 0
	}
	return cmp.Or(c.PutAheadBytes, store.DefaultPutAheadBytes)
}

// plan sizes the key sets so that at most a share of each segment is
// used: client i places its values on the next Replicas segments, so
// every segment holds Replicas clients' keys.
func (c *StoreConfig) plan() (gets, ring int, err error) {
	per := float64(reserved(c.ValueSize)) * float64(min(c.Replicas, c.Clients))
	seg := float64(c.SegmentSize)
	var gShare, pShare float64
	switch c.Operation {
	case "get":
		gShare = getShare
	case "put":
		pShare = putShare
	case "mixed":
		gShare, pShare = mixedGetShare, mixedPutShare
	}
	if gShare > 0 {
		gets = min(int(gShare*seg/per), maxGetKeys)
		if gets < c.Batch {
			return 0, 0, fmt.Errorf("%w: --segment_size %d holds %d values of %d bytes to read, fewer than --batch %d", ErrStoreConfig, c.SegmentSize, gets, c.ValueSize, c.Batch)
		}
	}
	if pShare > 0 {
		keys := func(room float64) int {
			n := min(int(room/per)/c.Threads, maxRingKeys)
			return n - n%c.Batch
		}
		room := pShare * seg
		if keys(room) < c.Batch {
			return 0, 0, fmt.Errorf("%w: --segment_size %d has no room for --threads %d x --batch %d values of %d bytes", ErrStoreConfig, c.SegmentSize, c.Threads, c.Batch, c.ValueSize)
		}
		// Reservations held ahead of puts take pool memory too: a budget
		// larger than the room above the share leaves less to the ring,
		// down to half its share and one batch per worker (reservations
		// that find no room are not made; the puts take two round trips).
		if c.PutAhead >= 0 {
			ahead := float64(reserved(int(c.aheadBytes()))) * float64(min(c.Replicas, c.Clients))
			room = max(min(room, aheadShare*seg-ahead), room/2)
		}
		ring = max(keys(room), c.Batch)
	}
	return gets, ring, nil
}

// OplogWait is one RPC's answers that waited for the log in a run.
type OplogWait struct {
	RPC     string  `json:"rpc"`     // as in /metrics: commit_put, batch_remove, ...
	Answers uint64  `json:"answers"` // answers that waited
	WaitUs  float64 `json:"wait_us"` // their mean wait
}

// stepResult is what one call did.
type stepResult struct {
	keys  int
	bytes int64
	get   bool
}

// stepFunc performs one call and records its latency in h.
type stepFunc func(ctx context.Context, h *Histogram) (stepResult, error)

// roundStats is what a set of workers did in one round.
type roundStats struct {
	Ops, Gets, Puts, Bytes int64
	Elapsed                time.Duration
	Hist                   Histogram
	// Stored[n] is the puts that stored n replicas since the clients
	// started (store.Stats.StoredReplicas; add leaves it alone).
	Stored []uint64
	// AllPuts and AheadPuts count the clients' puts and those committed
	// on a reservation held ahead, since the clients started.
	AllPuts, AheadPuts uint64
	// LocHits and LocMisses count the clients' gets from a cached
	// location and those that asked the master, since they started.
	LocHits, LocMisses uint64
}

func (r *roundStats) add(o *roundStats) {
	r.Ops += o.Ops
	r.Gets += o.Gets
	r.Puts += o.Puts
	r.Bytes += o.Bytes
	r.Hist.Merge(&o.Hist)
}

// drive runs every step in its own goroutine, back to back, until d has
// passed, ctx ends or a step fails; the round lasts until the last call
// in progress returned.
func drive(ctx context.Context, d time.Duration, steps []stepFunc) (*roundStats, error) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	parts := make([]roundStats, len(steps))
	start := time.Now()
	for i, step := range steps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &parts[i]
			for !stop.Load() && ctx.Err() == nil {
				r, err := step(ctx, &p.Hist)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				p.Ops += int64(r.keys)
				p.Bytes += r.bytes
				if r.get {
					p.Gets += int64(r.keys)
				} else {
					p.Puts += int64(r.keys)
				}
			}
		}()
	}
	t := time.NewTimer(d)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-done:
	}
	t.Stop()
	stop.Store(true)
	<-done
	out := &roundStats{Elapsed: time.Since(start)}
	for i := range parts {
		out.add(&parts[i])
	}
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return out, firstErr
}

// benchClient is one store client of the bench, in this process or in a
// child process.
type benchClient interface {
	segment() string
	masterProtocol() string
	// bufAddr is where peers find the client's value buffers (0 when
	// they are not registered).
	bufAddr() uint64
	prepare(ctx context.Context, p *storePlan) error
	run(ctx context.Context, d time.Duration) (*roundStats, error)
	// runEngine runs one round of the engine baseline.
	runEngine(ctx context.Context, d time.Duration) (*roundStats, error)
	close() error
}

// localClient is a store.Client with its workers.
type localClient struct {
	cfg   *StoreConfig
	index int
	c     *store.Client
	pool  *mempool.Pool // the workers' registered buffers (zero copy)
	bufs  []byte
	steps []stepFunc
	// The engine baseline's workers and the peer segment they use.
	engSteps  []stepFunc
	engSeg    engine.SegmentID
	engOpen   bool
	engPool   *mempool.Pool // the region peers' engine baseline uses
	engRegion []byte
	closeOnce sync.Once
}

func newLocalClient(ctx context.Context, cfg *StoreConfig, index int, masterAddr string) (*localClient, error) {
	sc := store.Config{
		MasterAddr: masterAddr, LocalHostname: cfg.LocalHostname,
		GlobalSegmentSize: cfg.SegmentSize, LocalBufferSize: cfg.LocalBufferSize, Logger: cfg.Logger,
		PutAhead: cfg.PutAhead, PutAheadBytes: cfg.PutAheadBytes, LocationCache: cfg.LocationCache, MasterProtocol: cfg.MasterProtocol, MasterDialer: masterDialer(cfg.MasterProtocol),
	}
	if cfg.tls != nil {
		sc.Security.TLS = cfg.tls.client
	}
	if cfg.Protocol != "" {
		sc.Protocols = []string{cfg.Protocol}
	}
	c, err := store.New(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("bench: client %d: %w", index, err)
	}
	lc := &localClient{cfg: cfg, index: index, c: c}
	size := int64(cfg.Threads) * int64(cfg.Batch) * int64(cfg.ValueSize)
	if cfg.Staged {
		lc.bufs = make([]byte, size)
	} else {
		if lc.pool, err = mempool.New(mempool.Options{Size: size, SlabSize: mempool.MinSlabSize, Name: "crescent-bench-values"}); err != nil {
			c.Close()
			return nil, fmt.Errorf("bench: value buffers: %w", err)
		}
		lc.bufs = lc.pool.Bytes()[:size:size]
		if err := c.RegisterBuffer(lc.bufs); err != nil {
			lc.close()
			return nil, fmt.Errorf("bench: register value buffers: %w", err)
		}
	}
	rand.Read(lc.bufs)
	if cfg.Baseline == BaselineEngine && lc.pool != nil {
		if err := lc.newEngineRegion(); err != nil {
			lc.close()
			return nil, fmt.Errorf("bench: client %d: %w", index, err)
		}
	}
	return lc, nil
}

func (lc *localClient) segment() string { return lc.c.SegmentName() }

func (lc *localClient) masterProtocol() string { return lc.c.MasterProtocol() }

func (lc *localClient) close() error {
	var err error
	lc.closeOnce.Do(func() {
		if lc.engOpen {
			lc.c.Engine().CloseSegment(lc.engSeg)
		}
		err = lc.c.Close()
		if lc.pool != nil {
			lc.pool.Close()
		}
		if lc.engPool != nil {
			lc.engPool.Close()
		}
	})
	return err
}

// replicateConfig places values on the following clients' segments, so
// every get and put crosses from one client to another.
func (lc *localClient) replicateConfig(p *storePlan) store.ReplicateConfig {
	rc := store.ReplicateConfig{Replicas: lc.cfg.Replicas}
	for k := 1; k < len(p.Peers); k++ {
		rc.Preferred = append(rc.Preferred, p.Peers[(lc.index+k)%len(p.Peers)])
	}
	return rc
}

// prepare stores this client's get keys, checks one reads back intact,
// and builds the workers.
func (lc *localClient) prepare(ctx context.Context, p *storePlan) error {
	cfg, c := lc.cfg, lc.c
	rc := lc.replicateConfig(p)
	vs := cfg.ValueSize
	gets := make([]string, p.GetKeys)
	for i := range gets {
		gets[i] = getKey(p.RunID, lc.index, i)
	}
	if len(gets) > 0 {
		src := lc.bufs[:vs]
		const chunk = 64
		vals := make([][]byte, chunk)
		for i := range vals {
			vals[i] = src
		}
		for i := 0; i < len(gets); i += chunk {
			keys := gets[i:min(i+chunk, len(gets))]
			for j, err := range c.BatchPut(ctx, keys, vals[:len(keys)], rc) {
				if err != nil {
					return fmt.Errorf("bench: client %d: populate %s: %w", lc.index, keys[j], err)
				}
			}
		}
		got, err := c.GetBuffer(ctx, gets[0])
		if err != nil {
			return fmt.Errorf("bench: client %d: read back %s: %w", lc.index, gets[0], err)
		}
		same, local := bytes.Equal(got.Bytes(), src), got.Local()
		got.Release()
		if !same {
			return fmt.Errorf("bench: client %d: %s read back different bytes", lc.index, gets[0])
		}
		// The point is client to client: no replica may sit in the
		// reader's own segment unless the replicas outnumber the others.
		if local && cfg.Replicas < len(p.Peers) {
			return fmt.Errorf("bench: client %d: %s was placed in the client's own segment", lc.index, gets[0])
		}
	}
	lc.steps = lc.steps[:0]
	for w := 0; w < cfg.Threads; w++ {
		buf := lc.bufs[w*cfg.Batch*vs : (w+1)*cfg.Batch*vs]
		sw := &storeWorker{
			cfg: cfg, c: c, rc: rc, buf: buf, gets: gets,
			rng:     mrand.New(mrand.NewPCG(uint64(lc.index), uint64(w))),
			getNext: w * len(gets) / cfg.Threads,
		}
		for i := 0; i < p.Ring; i++ {
			sw.ring = append(sw.ring, ringKey(p.RunID, lc.index, w, i))
		}
		sw.vals = make([][]byte, cfg.Batch)
		for i := range sw.vals {
			sw.vals[i] = buf[i*vs : (i+1)*vs]
		}
		sw.keys = make([]string, cfg.Batch)
		lc.steps = append(lc.steps, sw.step)
	}
	if cfg.Baseline == BaselineEngine {
		return lc.prepareEngine(ctx, p)
	}
	return nil
}

func (lc *localClient) run(ctx context.Context, d time.Duration) (*roundStats, error) {
	s, err := drive(ctx, d, lc.steps)
	if s != nil {
		st := lc.c.Stats()
		s.Stored = st.StoredReplicas[:]
		s.AllPuts, s.AheadPuts = st.Puts, st.PutsAhead
		s.LocHits, s.LocMisses = st.LocationHits, st.LocationMisses
	}
	return s, err
}

// storeWorker is one --threads worker of a client.
type storeWorker struct {
	cfg      *StoreConfig
	c        *store.Client
	rc       store.ReplicateConfig
	buf      []byte   // Batch values
	vals     [][]byte // buf cut into values
	keys     []string // scratch for batched gets
	gets     []string // the client's populated keys (shared, read-only)
	getNext  int
	ring     []string // keys this worker puts, in turn
	ringNext int
	ringFull bool // every ring key is stored: remove them before reuse
	rng      *mrand.Rand
}

func (w *storeWorker) step(ctx context.Context, h *Histogram) (stepResult, error) {
	get := w.cfg.Operation == "get" || (w.cfg.Operation == "mixed" && w.rng.Float64() < w.cfg.GetRatio)
	if get {
		return w.get(ctx, h)
	}
	return w.put(ctx, h)
}

func (w *storeWorker) get(ctx context.Context, h *Histogram) (stepResult, error) {
	vs, n := w.cfg.ValueSize, w.cfg.Batch
	for i := range n {
		w.keys[i] = w.gets[(w.getNext+i)%len(w.gets)]
	}
	w.getNext = (w.getNext + n) % len(w.gets)
	t0 := time.Now()
	switch {
	case n == 1 && !w.cfg.Staged:
		got, err := w.c.GetInto(ctx, w.keys[0], w.buf)
		h.Record(time.Since(t0))
		if err != nil {
			return stepResult{}, fmt.Errorf("bench: GetInto %s: %w", w.keys[0], err)
		}
		if got != vs {
			return stepResult{}, fmt.Errorf("bench: GetInto %s: %d bytes, want %d", w.keys[0], got, vs)
		}
	case n == 1:
		v, err := w.c.Get(ctx, w.keys[0])
		h.Record(time.Since(t0))
		if err != nil {
			return stepResult{}, fmt.Errorf("bench: Get %s: %w", w.keys[0], err)
		}
		if len(v) != vs {
			return stepResult{}, fmt.Errorf("bench: Get %s: %d bytes, want %d", w.keys[0], len(v), vs)
		}
	case !w.cfg.Staged:
		ns, errs := w.c.BatchGetInto(ctx, w.keys, w.vals)
		h.Record(time.Since(t0))
		for i, err := range errs {
			if err != nil {
				return stepResult{}, fmt.Errorf("bench: BatchGetInto %s: %w", w.keys[i], err)
			}
			if ns[i] != vs {
				return stepResult{}, fmt.Errorf("bench: BatchGetInto %s: %d bytes, want %d", w.keys[i], ns[i], vs)
			}
		}
	default:
		vals, errs := w.c.BatchGet(ctx, w.keys)
		h.Record(time.Since(t0))
		for i, err := range errs {
			if err != nil {
				return stepResult{}, fmt.Errorf("bench: BatchGet %s: %w", w.keys[i], err)
			}
			if len(vals[i]) != vs {
				return stepResult{}, fmt.Errorf("bench: BatchGet %s: %d bytes, want %d", w.keys[i], len(vals[i]), vs)
			}
		}
	}
	return stepResult{keys: n, bytes: int64(n) * int64(vs), get: true}, nil
}

func (w *storeWorker) put(ctx context.Context, h *Histogram) (stepResult, error) {
	vs, n := w.cfg.ValueSize, w.cfg.Batch
	if w.ringNext == 0 && w.ringFull {
		// One RPC per lap of the ring, outside the call's latency but
		// inside the round's time. Not forced: nothing reads these keys
		// (no lease), and a forced remove is an admin operation a master
		// with the protected default refuses.
		for i, err := range w.c.BatchRemove(ctx, w.ring, false) {
			if err != nil {
				return stepResult{}, fmt.Errorf("bench: BatchRemove %s: %w", w.ring[i], err)
			}
		}
		w.ringFull = false
	}
	keys := w.ring[w.ringNext : w.ringNext+n]
	if w.ringNext += n; w.ringNext == len(w.ring) {
		w.ringNext, w.ringFull = 0, true
	}
	t0 := time.Now()
	if n == 1 {
		var err error
		if w.cfg.Staged {
			err = w.c.Put(ctx, keys[0], w.vals[0], w.rc)
		} else {
			err = w.c.PutFrom(ctx, keys[0], w.vals[0], w.rc)
		}
		h.Record(time.Since(t0))
		if err != nil {
			return stepResult{}, fmt.Errorf("bench: put %s: %w", keys[0], err)
		}
	} else {
		errs := w.c.BatchPut(ctx, keys, w.vals, w.rc)
		h.Record(time.Since(t0))
		for i, err := range errs {
			if err != nil {
				return stepResult{}, fmt.Errorf("bench: BatchPut %s: %w", keys[i], err)
			}
		}
	}
	return stepResult{keys: n, bytes: int64(n) * int64(vs)}, nil
}

// redisSide is the baseline: the same key sets, value size, operation
// mix and concurrency through go-redis (one connection per worker).
type redisSide struct {
	rdbs  []*redis.Client
	steps []stepFunc
}

func newRedisSide(ctx context.Context, addr string, cfg *StoreConfig, p *storePlan) (*redisSide, error) {
	rs := &redisSide{}
	vs := cfg.ValueSize
	src := make([]byte, cfg.Batch*vs)
	rand.Read(src)
	for ci := 0; ci < cfg.Clients; ci++ {
		rdb := redis.NewClient(&redis.Options{
			Addr: addr, PoolSize: cfg.Threads, MinIdleConns: cfg.Threads, MaxRetries: -1,
			ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		rs.rdbs = append(rs.rdbs, rdb)
		gets := make([]string, p.GetKeys)
		for i := range gets {
			gets[i] = getKey(p.RunID, ci, i)
		}
		for i := 0; i < len(gets); i += 64 {
			_, err := rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
				for _, k := range gets[i:min(i+64, len(gets))] {
					pl.Set(ctx, k, src[:vs], 0)
				}
				return nil
			})
			if err != nil {
				rs.close()
				return nil, fmt.Errorf("bench: redis populate: %w", err)
			}
		}
		for w := 0; w < cfg.Threads; w++ {
			rw := &redisWorker{
				cfg: cfg, rdb: rdb, gets: gets, buf: src, getNext: w * len(gets) / cfg.Threads,
				rng:  mrand.New(mrand.NewPCG(uint64(ci), uint64(w))),
				keys: make([]string, cfg.Batch),
			}
			for i := 0; i < p.Ring; i++ {
				rw.ring = append(rw.ring, ringKey(p.RunID, ci, w, i))
			}
			rs.steps = append(rs.steps, rw.step)
		}
	}
	return rs, nil
}

func (rs *redisSide) close() {
	for _, r := range rs.rdbs {
		r.Close()
	}
}

type redisWorker struct {
	cfg      *StoreConfig
	rdb      *redis.Client
	gets     []string
	getNext  int
	ring     []string
	ringNext int
	buf      []byte
	keys     []string
	rng      *mrand.Rand
}

func (w *redisWorker) step(ctx context.Context, h *Histogram) (stepResult, error) {
	vs, n := w.cfg.ValueSize, w.cfg.Batch
	get := w.cfg.Operation == "get" || (w.cfg.Operation == "mixed" && w.rng.Float64() < w.cfg.GetRatio)
	if get {
		for i := range n {
			w.keys[i] = w.gets[(w.getNext+i)%len(w.gets)]
		}
		w.getNext = (w.getNext + n) % len(w.gets)
	} else {
		copy(w.keys, w.ring[w.ringNext:w.ringNext+n])
		w.ringNext = (w.ringNext + n) % len(w.ring)
	}
	t0 := time.Now()
	var err error
	switch {
	case n == 1 && get:
		var v []byte
		if v, err = w.rdb.Get(ctx, w.keys[0]).Bytes(); err == nil && len(v) != vs {
			err = fmt.Errorf("%d bytes, want %d", len(v), vs)
		}
	case n == 1:
		err = w.rdb.Set(ctx, w.keys[0], w.buf[:vs], 0).Err()
	default:
		// A pipeline of n GETs or SETs: the same round trips as a batch.
		var cmds []redis.Cmder
		cmds, err = w.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for i, k := range w.keys {
				if get {
					pl.Get(ctx, k)
				} else {
					pl.Set(ctx, k, w.buf[i*vs:(i+1)*vs], 0)
				}
			}
			return nil
		})
		for _, c := range cmds {
			if sc, ok := c.(*redis.StringCmd); ok && err == nil && len(sc.Val()) != vs {
				err = fmt.Errorf("%d bytes, want %d", len(sc.Val()), vs)
			}
		}
	}
	h.Record(time.Since(t0))
	if err != nil {
		return stepResult{}, fmt.Errorf("bench: redis %s: %w", map[bool]string{true: "GET", false: "SET"}[get], err)
	}
	return stepResult{keys: n, bytes: int64(n) * int64(vs), get: get}, nil
}

// inProcessMaster is a master (with its operation log, if any) and its
// gRPC service on a loopback port.
type inProcessMaster struct {
	m     *master.Master
	d     *oplog.Durable // nil with the log off
	oplog string         // off, local or etcd...
	dir   string         // the local log's directory
	cli   *clientv3.Client
	etcd  *embed.Etcd
	// etcdDir is where the embedded etcd's data goes (default: the
	// working directory).
	etcdDir string
	tmp     []string // directories to remove
	addr    string
	cancel  context.CancelFunc
	done    chan error
	// drpcDone is the drpc server's end (--master_protocol drpc).
	drpcDone <-chan error
	svc      *service.Service
}

func (im *inProcessMaster) close() error {
	im.cancel()
	err := <-im.done
	if im.drpcDone != nil {
		err = errors.Join(err, <-im.drpcDone)
	}
	err = errors.Join(err, im.closeMaster())
	im.closeLog()
	return err
}

// RunStore runs the store benchmark: a master (in this process unless
// MasterAddr is set, with the operation log Oplog), Clients clients, and,
// in the same run, the baseline (Redis, or with the log on the same
// workload against a second in-process master with the log off),
// alternating with the measurement in rounds of about a second so drift
// on a noisy machine weighs on both.
func RunStore(ctx context.Context, c StoreConfig) (res *StoreResult, err error) {
	if err := c.setDefaults(); err != nil {
		return nil, err
	}
	addr, where := c.MasterAddr, c.MasterAddr
	var im, bm *inProcessMaster
	if addr == "" {
		if im, err = newMaster(ctx, &c, c.Oplog); err != nil {
			return nil, fmt.Errorf("bench: start master: %w", err)
		}
		defer func() { err = errors.Join(err, im.close()) }()
		addr, where = im.addr, "in-process"
	}
	if c.Baseline == BaselineOplogOff {
		if bm, err = newMaster(ctx, &c, OplogOff); err != nil {
			return nil, fmt.Errorf("bench: start baseline master: %w", err)
		}
		defer func() { err = errors.Join(err, bm.close()) }()
	}
	if c.Baseline == BaselineTLSOff {
		if bm, err = newMaster(ctx, c.withoutTLS(), c.Oplog); err != nil {
			return nil, fmt.Errorf("bench: start baseline master: %w", err)
		}
		defer func() { err = errors.Join(err, bm.close()) }()
	}
	if c.Operation == "meta" {
		res, err := runMeta(ctx, &c, addr, bm)
		if res != nil {
			res.Master = where
			im.describe(res)
		}
		return res, err
	}
	gets, ring, err := c.plan()
	if err != nil {
		return nil, err
	}
	p := &storePlan{RunID: runID(), GetKeys: gets, Ring: ring}
	clients, err := startClients(ctx, &c, addr, p)
	defer func() { err = errors.Join(err, closeClients(clients)) }()
	if err != nil {
		return nil, err
	}
	// baseline runs one round of the baseline; nil: none.
	var baseline func(d time.Duration) (*roundStats, error)
	switch c.Baseline {
	case "redis":
		srv, err := StartRedis(c.RedisServer)
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		rs, err := newRedisSide(ctx, srv.Addr, &c, p)
		if err != nil {
			return nil, err
		}
		defer rs.close()
		baseline = func(d time.Duration) (*roundStats, error) { return drive(ctx, d, rs.steps) }
	case BaselineOplogOff, BaselineTLSOff:
		bc := &c
		if c.Baseline == BaselineTLSOff {
			bc = c.withoutTLS()
		}
		bp := &storePlan{RunID: p.RunID, GetKeys: gets, Ring: ring}
		bcs, err := startClients(ctx, bc, bm.addr, bp)
		defer func() { err = errors.Join(err, closeClients(bcs)) }()
		if err != nil {
			return nil, err
		}
		baseline = func(d time.Duration) (*roundStats, error) { return runClients(ctx, bcs, d) }
	case BaselineEngine:
		baseline = func(d time.Duration) (*roundStats, error) { return runClientsEngine(ctx, clients, d) }
	}

	if c.Warmup > 0 {
		if _, err := runClients(ctx, clients, c.Warmup); err != nil {
			return nil, err
		}
		if baseline != nil {
			if _, err := baseline(c.Warmup); err != nil {
				return nil, err
			}
		}
	}
	var evicted0 uint64
	if im != nil {
		evicted0 = im.m.Stats().EvictedKeys
	}
	log0 := im.logStats()
	rounds := max(1, int((c.Duration+time.Second/2)/time.Second))
	d := c.Duration / time.Duration(rounds)
	var tot, base roundStats
	var last *roundStats // counts since the clients started, as of the last round
	for r := 0; r < rounds; r++ {
		var bg float64
		if baseline != nil {
			b, err := baseline(d)
			if err != nil {
				return nil, err
			}
			base.add(b)
			base.Elapsed += b.Elapsed
			bg = float64(b.Bytes) / b.Elapsed.Seconds() / 1e9
		}
		s, err := runClients(ctx, clients, d)
		if err != nil {
			return nil, err
		}
		tot.add(s)
		tot.Elapsed += s.Elapsed
		last = s
		if c.Progress != nil {
			fmt.Fprintf(c.Progress, "round %d/%d: crescent %.2f GB/s, %s %.2f GB/s\n", r+1, rounds,
				float64(s.Bytes)/s.Elapsed.Seconds()/1e9, c.Baseline, bg)
		}
	}
	res = &StoreResult{
		Operation: c.Operation, ValueSize: c.ValueSize, Clients: c.Clients, ClientProcesses: c.ClientProcesses,
		Threads: c.Threads, Batch: c.Batch, Replicas: c.Replicas, ZeroCopy: c.zeroCopy(), Protocol: c.Protocol,
		GetKeys: gets, RingKeys: ring, Baseline: c.Baseline, Master: where, PutAhead: c.PutAhead, PutAheadBytes: c.aheadBytes(),
		MasterProtocol: clients[0].masterProtocol(),
		DurationS:      tot.Elapsed.Seconds(), Ops: tot.Ops, Gets: tot.Gets, Puts: tot.Puts, Bytes: tot.Bytes,
	}
	res.Protocol = cmp.Or(res.Protocol, "default")
	res.ReplicasStoredMin, res.ReplicasStoredMax, res.UnderReplicatedPuts = replicaRange(last.Stored, c.Replicas)
	if last.AllPuts > 0 {
		res.PutsAheadShare = float64(last.AheadPuts) / float64(last.AllPuts)
	}
	res.LocationCache = c.LocationCache
	if n := last.LocHits + last.LocMisses; n > 0 {
		res.LocationHitShare = float64(last.LocHits) / float64(n)
	}
	if im != nil {
		ev := im.m.Stats().EvictedKeys - evicted0
		res.EvictedKeys = &ev
		im.describe(res)
		im.describeLog(res, log0, tot.Puts, tot.Elapsed)
	}
	res.OpsPerSec = float64(tot.Ops) / tot.Elapsed.Seconds()
	res.ThroughputGBps = float64(tot.Bytes) / tot.Elapsed.Seconds() / 1e9
	res.P50us, res.P99us, res.P999us = percentiles(&tot.Hist)
	if baseline != nil && base.Elapsed > 0 {
		res.BaselineOpsPerSec = float64(base.Ops) / base.Elapsed.Seconds()
		res.BaselineGBps = float64(base.Bytes) / base.Elapsed.Seconds() / 1e9
		res.BaselineP50us, res.BaselineP99us, res.BaselineP999us = percentiles(&base.Hist)
		if res.BaselineGBps > 0 {
			res.Ratio = res.ThroughputGBps / res.BaselineGBps
		}
	}
	return res, nil
}

// describe records the in-process master's log in res.
func (im *inProcessMaster) describe(res *StoreResult) {
	if im == nil {
		res.Oplog = "external"
		return
	}
	res.Oplog = im.oplog
}

// startClients starts Clients clients of the master at addr and prepares
// them with p (whose Peers it fills). On error the clients started so
// far are returned for closeClients.
func startClients(ctx context.Context, c *StoreConfig, addr string, p *storePlan) ([]benchClient, error) {
	clients := make([]benchClient, 0, c.Clients)
	for i := 0; i < c.Clients; i++ {
		var bc benchClient
		var err error
		if c.ClientProcesses {
			bc, err = startRemoteClient(ctx, c, i, addr)
		} else {
			bc, err = newLocalClient(ctx, c, i, addr)
		}
		if err != nil {
			return clients, err
		}
		clients = append(clients, bc)
		p.Peers = append(p.Peers, bc.segment())
		p.PeerBufs = append(p.PeerBufs, bc.bufAddr())
	}
	return clients, eachClient(clients, func(_ int, bc benchClient) error { return bc.prepare(ctx, p) })
}

func closeClients(cs []benchClient) error {
	var err error
	for _, bc := range cs {
		err = errors.Join(err, bc.close())
	}
	return err
}

// runClients runs one round of every client's workers.
func runClients(ctx context.Context, clients []benchClient, d time.Duration) (*roundStats, error) {
	return runRound(clients, func(bc benchClient) (*roundStats, error) { return bc.run(ctx, d) })
}

// runClientsEngine runs one round of every client's engine baseline.
func runClientsEngine(ctx context.Context, clients []benchClient, d time.Duration) (*roundStats, error) {
	return runRound(clients, func(bc benchClient) (*roundStats, error) { return bc.runEngine(ctx, d) })
}

func runRound(clients []benchClient, run func(benchClient) (*roundStats, error)) (*roundStats, error) {
	parts := make([]*roundStats, len(clients))
	err := eachClient(clients, func(i int, bc benchClient) error {
		var err error
		parts[i], err = run(bc)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := &roundStats{}
	for _, p := range parts {
		out.add(p)
		out.Elapsed = max(out.Elapsed, p.Elapsed)
		for n, k := range p.Stored {
			if n >= len(out.Stored) {
				out.Stored = append(out.Stored, make([]uint64, n+1-len(out.Stored))...)
			}
			out.Stored[n] += k
		}
		out.AllPuts += p.AllPuts
		out.AheadPuts += p.AheadPuts
		out.LocHits += p.LocHits
		out.LocMisses += p.LocMisses
	}
	return out, nil
}

// replicaRange summarises puts by replicas stored: the fewest and most
// replicas a put stored, and how many puts stored fewer than asked.
func replicaRange(stored []uint64, asked int) (lo, hi int, under int64) {
	lo = -1
	for n, k := range stored {
		if k == 0 {
			continue
		}
		if lo < 0 {
			lo = n
		}
		hi = n
		if n < asked {
			under += int64(k)
		}
	}
	return max(lo, 0), hi, under
}

// zeroCopy reports whether every call moves values with no copy in user
// space: not when staged.
func (c *StoreConfig) zeroCopy() bool {
	return !c.Staged
}

func percentiles(h *Histogram) (p50, p99, p999 float64) {
	return float64(h.Quantile(0.50)) / 1e3, float64(h.Quantile(0.99)) / 1e3, float64(h.Quantile(0.999)) / 1e3
}

// eachClient runs fn on every client concurrently and joins the errors.
func eachClient(cs []benchClient, fn func(int, benchClient) error) error {
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, bc := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i, bc)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func runID() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
