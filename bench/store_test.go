package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/crescent-kv/crescent/internal/redisproc"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// storeChildEnv makes this test binary a store client process
// (ServeStoreClient on stdin/stdout) for TestRunStoreProcesses.
const storeChildEnv = "CRESCENT_BENCH_STORE_CHILD"

func init() {
	// Before TestMain: a child must not run the tests.
	if os.Getenv(storeChildEnv) == "1" {
		if err := ServeStoreClient(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "store child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// requireRedis skips the test when redis-server is missing, or fails it
// under CRESCENT_REQUIRE_DEPS=1 (make test).
func requireRedis(t *testing.T) {
	t.Helper()
	if RedisAvailable("") {
		return
	}
	msg := "redis-server not installed; run `make deps`"
	if os.Getenv("CRESCENT_REQUIRE_DEPS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// smallStore is a quick configuration: two clients of 32 MiB.
func smallStore(op, baseline string) StoreConfig {
	return StoreConfig{
		Operation: op, Baseline: baseline, Clients: 2, Threads: 2,
		SegmentSize: 32 << 20, LocalBufferSize: 8 << 20, ValueSize: 64 << 10,
		Duration: 300 * time.Millisecond, Warmup: -1,
	}
}

// checkResult asserts a result is complete and self-consistent.
func checkResult(t *testing.T, c StoreConfig, res *StoreResult) {
	t.Helper()
	if res.Ops == 0 || res.OpsPerSec <= 0 || res.ThroughputGBps <= 0 || res.DurationS <= 0 {
		t.Fatalf("empty result %+v", res)
	}
	if res.Ops%int64(c.Batch) != 0 || res.Gets+res.Puts != res.Ops {
		t.Fatalf("ops %d = gets %d + puts %d, batch %d", res.Ops, res.Gets, res.Puts, c.Batch)
	}
	if res.Bytes != res.Ops*int64(c.ValueSize) {
		t.Fatalf("bytes %d for %d ops of %d", res.Bytes, res.Ops, c.ValueSize)
	}
	switch c.Operation {
	case "get":
		if res.Puts != 0 || res.GetKeys == 0 {
			t.Fatalf("get run did %d puts with %d keys", res.Puts, res.GetKeys)
		}
	case "put":
		if res.Gets != 0 || res.RingKeys == 0 {
			t.Fatalf("put run did %d gets with a ring of %d", res.Gets, res.RingKeys)
		}
	case "mixed":
		if res.Gets == 0 || res.Puts == 0 {
			t.Fatalf("mixed run: %d gets, %d puts", res.Gets, res.Puts)
		}
	}
	// Puts of one size repeatedly: put-ahead commits some in one round
	// trip, none with it off.
	switch {
	case c.PutAhead < 0:
		assert.Zero(t, res.PutsAheadShare, "put-ahead off")
	case c.Operation == "put" || c.Operation == "mixed":
		assert.Greater(t, res.PutsAheadShare, 0.0, "puts ahead")
		assert.LessOrEqual(t, res.PutsAheadShare, 1.0)
	}
	if !(res.P50us > 0 && res.P50us <= res.P99us && res.P99us <= res.P999us) {
		t.Fatalf("latency percentiles %v %v %v", res.P50us, res.P99us, res.P999us)
	}
	// What was stored: every put got its replicas, but where the clients
	// are fewer than the replicas asked.
	if want := min(max(c.Replicas, 1), c.Clients); res.ReplicasStoredMin != want || res.ReplicasStoredMax != want {
		t.Fatalf("replicas stored %d..%d, want %d", res.ReplicasStoredMin, res.ReplicasStoredMax, want)
	}
	if (res.UnderReplicatedPuts > 0) != (c.Replicas > c.Clients) {
		t.Fatalf("%d puts under-replicated, %d replicas asked of %d clients", res.UnderReplicatedPuts, c.Replicas, c.Clients)
	}
	if res.EvictedKeys == nil || *res.EvictedKeys != 0 {
		t.Fatalf("evicted keys %v", res.EvictedKeys)
	}
	if res.Baseline != c.Baseline {
		t.Fatalf("baseline %q, asked %q", res.Baseline, c.Baseline)
	}
	if c.Baseline == "redis" || c.Baseline == BaselineOplogOff || c.Baseline == BaselineEngine {
		if res.BaselineGBps <= 0 || res.BaselineOpsPerSec <= 0 || res.BaselineP50us <= 0 {
			t.Fatalf("%s baseline empty: %+v", c.Baseline, res)
		}
		if math.Abs(res.Ratio-res.ThroughputGBps/res.BaselineGBps) > 1e-9 {
			t.Fatalf("ratio %v != %v / %v", res.Ratio, res.ThroughputGBps, res.BaselineGBps)
		}
	} else if res.BaselineGBps != 0 || res.Ratio != 0 {
		t.Fatalf("no baseline, yet %v GB/s ratio %v", res.BaselineGBps, res.Ratio)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"operation", "value_size", "clients", "threads", "duration_s", "ops_per_sec", "throughput_gbps",
		"baseline", "baseline_gbps", "ratio", "p50_us", "p99_us", "p999_us"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
}

func TestRunStoreInProcess(t *testing.T) {
	for _, baseline := range []string{"none", "redis"} {
		for _, op := range []string{"put", "get", "mixed"} {
			t.Run(op+"/"+baseline, func(t *testing.T) {
				if baseline == "redis" {
					requireRedis(t)
				}
				c := smallStore(op, baseline)
				res, err := RunStore(context.Background(), c)
				if err != nil {
					t.Fatal(err)
				}
				c.Batch = 1
				checkResult(t, c, res)
				if !res.ZeroCopy || res.Clients != 2 || res.Threads != 2 || res.Master != "in-process" {
					t.Fatalf("result describes another run: %+v", res)
				}
			})
		}
	}
}

// TestRunStoreVariants covers batched calls, heap (staged) values,
// replicas and one client (its values land in its own segment).
func TestRunStoreVariants(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*StoreConfig)
	}{
		{"batch-put", func(c *StoreConfig) { c.Operation, c.Batch = "put", 4 }},
		{"batch-get", func(c *StoreConfig) { c.Operation, c.Batch = "get", 4 }},
		{"staged-mixed", func(c *StoreConfig) { c.Operation, c.Staged = "mixed", true }},
		{"staged-batch-mixed", func(c *StoreConfig) { c.Operation, c.Staged, c.Batch = "mixed", true, 3 }},
		{"replicas", func(c *StoreConfig) { c.Clients, c.Replicas, c.Operation = 3, 2, "mixed" }},
		{"one-client", func(c *StoreConfig) { c.Clients, c.Operation = 1, "mixed" }},
		{"under-replicated", func(c *StoreConfig) { c.Clients, c.Replicas, c.Operation = 1, 2, "put" }},
		{"tcp", func(c *StoreConfig) { c.Protocol, c.Operation = "tcp", "get" }},
		{"put-ahead-off", func(c *StoreConfig) { c.PutAhead, c.Operation = -1, "put" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := smallStore("", "none")
			c.Duration = 200 * time.Millisecond
			tc.edit(&c)
			res, err := RunStore(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			c.Batch = max(c.Batch, 1)
			checkResult(t, c, res)
			zc := !c.Staged // batched gets too (BatchGetInto)
			if res.Batch != c.Batch || res.ZeroCopy != zc || res.Replicas != max(c.Replicas, 1) {
				t.Fatalf("result describes another run: %+v", res)
			}
		})
	}
}

// TestRunStoreExternalMaster runs against a master the test owns and
// checks the bench leaves nothing on it.
func TestRunStoreExternalMaster(t *testing.T) {
	im, err := newMaster(context.Background(), &StoreConfig{}, OplogOff)
	if err != nil {
		t.Fatal(err)
	}
	defer im.close()
	for _, op := range []string{"mixed", "meta"} {
		c := smallStore(op, "none")
		c.MasterAddr, c.Objects = im.addr, 3000
		res, err := RunStore(context.Background(), c)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if res.Master != im.addr || res.EvictedKeys != nil {
			t.Fatalf("%s: master %q, evicted %v", op, res.Master, res.EvictedKeys)
		}
		if op == "meta" && (res.Ops != 3000 || res.Puts != 3000 || res.OpsPerSec <= 0 || res.Batch != DefaultMetaBatch || res.P50us <= 0) {
			t.Fatalf("meta result %+v", res)
		}
		st := im.m.Stats()
		if st.Keys != 0 || st.Segments != 0 {
			t.Fatalf("%s left %d keys and %d segments on the master", op, st.Keys, st.Segments)
		}
	}
}

func TestRunStoreProcesses(t *testing.T) {
	c := smallStore("mixed", "none")
	c.ClientProcesses = true
	c.ClientCommand = []string{os.Args[0], "-test.run=^$"}
	c.ClientEnv = []string{storeChildEnv + "=1"}
	res, err := RunStore(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	c.Batch = 1
	checkResult(t, c, res)
	if !res.ClientProcesses {
		t.Fatal("result does not say client processes")
	}

	// A child that fails to start its client reports why.
	c.Protocol = "carrier-pigeon"
	_, err = RunStore(context.Background(), c)
	if err == nil || !strings.Contains(err.Error(), "client process 0") || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Fatalf("unknown protocol in the child: %v", err)
	}
}

func TestStoreConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*StoreConfig)
	}{
		{"operation", func(c *StoreConfig) { c.Operation = "erase" }},
		{"baseline", func(c *StoreConfig) { c.Baseline = "memcached" }},
		{"get ratio", func(c *StoreConfig) { c.GetRatio = 1.5 }},
		{"clients", func(c *StoreConfig) { c.Clients = -1 }},
		{"threads", func(c *StoreConfig) { c.Threads = -2 }},
		{"replicas", func(c *StoreConfig) { c.Replicas = 17 }},
		{"batch", func(c *StoreConfig) { c.Batch = -1 }},
		{"value", func(c *StoreConfig) { c.ValueSize = -5 }},
		{"processes without command", func(c *StoreConfig) { c.ClientProcesses = true }},
		{"get keys do not fit", func(c *StoreConfig) { c.ValueSize, c.SegmentSize = 1<<20, 1<<20 }},
		{"put ring does not fit", func(c *StoreConfig) { c.Operation, c.Batch, c.SegmentSize = "put", 64, 8<<20 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := smallStore("get", "none")
			tc.edit(&c)
			_, err := RunStore(context.Background(), c)
			if !errors.Is(err, ErrStoreConfig) {
				t.Fatalf("got %v, want ErrStoreConfig", err)
			}
		})
	}
}

func TestHistogramWire(t *testing.T) {
	var h Histogram
	for i := 1; i <= 500; i++ {
		h.Record(time.Duration(i*i) * time.Microsecond)
	}
	b, err := json.Marshal(h.wire())
	if err != nil {
		t.Fatal(err)
	}
	var w histWire
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	got, err := w.histogram()
	if err != nil {
		t.Fatal(err)
	}
	if got != h {
		t.Fatal("histogram changed on the wire")
	}
	for _, bad := range []histWire{
		{N: 1, Buckets: [][2]uint64{{1 << 20, 1}}},
		{N: 2, Buckets: [][2]uint64{{3, 1}}},
		{N: 1, Max: -1, Buckets: [][2]uint64{{3, 1}}},
	} {
		if _, err := bad.histogram(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestStartRedis(t *testing.T) {
	if _, err := StartRedis("/nonexistent/redis-server"); !errors.Is(err, ErrNoRedis) {
		t.Fatalf("missing binary: %v", err)
	}
	requireRedis(t)
	r, err := StartRedis("")
	if err != nil {
		t.Fatal(err)
	}
	if err := redisproc.Ping(r.Addr); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if redisproc.Ping(r.Addr) == nil {
		t.Fatal("redis still answers after Close")
	}
}

func TestServeStoreClientBadCommands(t *testing.T) {
	for _, in := range []string{"not json\n", `{"cmd":"run"}` + "\n", `{"cmd":"prepare"}` + "\n"} {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.CreateTemp(t.TempDir(), "out")
		if err != nil {
			t.Fatal(err)
		}
		pw.WriteString(in)
		pw.Close()
		err = ServeStoreClient(context.Background(), pr, out)
		pr.Close()
		b, _ := os.ReadFile(out.Name())
		out.Close()
		if in == "not json\n" {
			if err == nil {
				t.Fatal("bad JSON accepted")
			}
			continue
		}
		var reply clientMsg
		if err != nil || json.Unmarshal(b, &reply) != nil || reply.Error == "" {
			t.Fatalf("%q: err %v, reply %q", in, err, b)
		}
	}
}

// TestRunStoreOplog runs put and meta with the in-process master's log on
// (local files, an embedded etcd) against the same run's log-off
// baseline.
func TestRunStoreOplog(t *testing.T) {
	for _, log := range []string{OplogLocal, OplogEtcd} {
		for _, op := range []string{"put", "meta"} {
			t.Run(log+"/"+op, func(t *testing.T) {
				c := smallStore(op, "")
				// A directory that does not exist yet: both logs create it.
				c.Oplog, c.OplogDir, c.Objects = log, filepath.Join(t.TempDir(), "new"), 2000
				res, err := RunStore(context.Background(), c)
				require.NoError(t, err)
				assert.Equal(t, BaselineOplogOff, res.Baseline, "the default baseline with the log on")
				assert.Equal(t, log, res.Oplog)
				assert.Positive(t, res.OpsPerSec)
				assert.Positive(t, res.BaselineOpsPerSec)
				assert.Positive(t, res.Ratio)
				if op == "meta" {
					assert.Equal(t, int64(2000), res.Ops)
					assert.InDelta(t, res.OpsPerSec/res.BaselineOpsPerSec, res.Ratio, 1e-9)
					return
				}
				c.Batch, c.Baseline = 1, BaselineOplogOff
				checkResult(t, c, res)
				assert.Positive(t, res.BaselineGBps)
				assert.InDelta(t, res.ThroughputGBps/res.BaselineGBps, res.Ratio, 1e-9)
				assert.Positive(t, res.OplogCommitsPerSec)
				assert.Positive(t, res.OplogEntriesPerCommit)
				// Every put's answer waits for its commit to be durable.
				assert.Positive(t, res.OplogDurableWaitUs)
				// Split by RPC: the commits are there, every entry waited,
				// and the parts add up to the mean.
				var answers uint64
				var total float64
				rpcs := map[string]bool{}
				for _, w := range res.OplogWaits {
					assert.Positive(t, w.Answers, w.RPC)
					assert.Positive(t, w.WaitUs, w.RPC)
					answers += w.Answers
					total += w.WaitUs * float64(w.Answers)
					rpcs[w.RPC] = true
				}
				assert.True(t, rpcs["commit_put"], "%+v", res.OplogWaits)
				require.Positive(t, answers)
				assert.InEpsilon(t, res.OplogDurableWaitUs, total/float64(answers), 1e-6)
				for i := 1; i < len(res.OplogWaits); i++ {
					a, b := res.OplogWaits[i-1], res.OplogWaits[i]
					assert.GreaterOrEqual(t, a.WaitUs*float64(a.Answers), b.WaitUs*float64(b.Answers), "longest total first")
				}
				if log == OplogLocal {
					assert.Positive(t, res.OplogBytesPerPut)
					assert.Positive(t, res.OplogFsyncUs)
				}
			})
		}
	}
}

func TestStoreConfigOplogErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*StoreConfig)
	}{
		{"backend", func(c *StoreConfig) { c.Oplog = "tape" }},
		{"etcd url", func(c *StoreConfig) { c.Oplog = "etcd://nowhere" }},
		{"with an external master", func(c *StoreConfig) { c.Oplog, c.MasterAddr = OplogLocal, "127.0.0.1:1" }},
		{"dir without a log", func(c *StoreConfig) { c.OplogDir = t.TempDir() }},
		{"dir with external etcd", func(c *StoreConfig) { c.Oplog, c.OplogDir = "etcd://127.0.0.1:2379", t.TempDir() }},
		{"oplog_off baseline without a log", func(c *StoreConfig) { c.Baseline = BaselineOplogOff }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := smallStore("put", "none")
			tc.edit(&c)
			_, err := RunStore(context.Background(), c)
			require.ErrorIs(t, err, ErrStoreConfig)
		})
	}
}
