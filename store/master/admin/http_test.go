package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/master/service"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

func TestAdminHandler(t *testing.T) {
	e := mastertest.New(t, nil)
	a := mastertest.Client(1)
	e.Mount(a, "seg-a:1", 1<<20)
	e.Put(a, "k1", 1000, master.ReplicateConfig{})
	e.Put(a, "k2", 2000, master.ReplicateConfig{HardPin: true})
	if _, _, err := e.M.GetReplicaList("k1"); err != nil {
		t.Fatal(err)
	}
	e.Reserve(a, 4096, master.ReplicateConfig{}, 2)
	var metrics *Metrics
	svc := service.New(e.M, service.WithObserver(func(rpc string, d time.Duration, err error) { metrics.Observe(rpc, d, err) }))
	metrics = NewMetrics(e.M, svc)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	extra := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "extra "+r.URL.Path) })
	srv := httptest.NewServer(Handler(e.M, svc, reg, extra))
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	if code, body := get("/health"); code != 200 || strings.TrimSpace(body) != "OK" {
		t.Fatalf("health %d %q", code, body)
	}
	code, body := get("/metrics")
	if code != 200 {
		t.Fatalf("metrics %d", code)
	}
	for _, want := range []string{
		"master_total_capacity_bytes 1.048576e+06", "master_key_count 2", "master_hard_pin_key_count 1",
		"master_active_clients 1", "master_segment_count 1", "master_put_start_requests_total 0", "master_get_replica_list_requests_total 0", "master_batch_put_start_items_total 0",
		"master_reservation_count 2", "master_reserved_bytes 8192", "master_commit_put_items_total 0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if _, body := get("/metrics/summary"); !strings.Contains(body, "Keys: 2 (0 unfinished, 0 soft-pinned, 1 hard-pinned)") ||
		!strings.Contains(body, "1 segments, 1 active clients") || !strings.Contains(body, "Put-ahead reservations: 2 (8.0 KiB)") {
		t.Fatalf("summary:\n%s", body)
	}
	code, body = get("/query_key?key=k1")
	var k map[string]any
	if code != 200 || json.Unmarshal([]byte(body), &k) != nil || k["key"] != "k1" || k["size"] != float64(1000) || k["leased"] != true {
		t.Fatalf("query_key %d %s", code, body)
	}
	reps, _ := k["replicas"].([]any)
	if len(reps) != 1 || reps[0].(map[string]any)["segment"] != "seg-a:1" || reps[0].(map[string]any)["status"] != "COMPLETE" {
		t.Fatalf("replicas %v", reps)
	}
	if code, _ := get("/query_key?key=missing"); code != 404 {
		t.Fatalf("missing key: %d", code)
	}
	if code, _ := get("/query_key"); code != 400 {
		t.Fatalf("no key: %d", code)
	}
	if _, body := get("/get_all_keys"); body != "k1\nk2\n" {
		t.Fatalf("keys %q", body)
	}
	var segs []map[string]any
	if _, body := get("/get_all_segments"); json.Unmarshal([]byte(body), &segs) != nil || len(segs) != 1 || segs[0]["name"] != "seg-a:1" || segs[0]["capacity"] != float64(1<<20) {
		t.Fatalf("segments %s", body)
	}
	if _, body := get("/metadata?key=x"); body != "extra /metadata" {
		t.Fatalf("extra handler: %q", body)
	}
}

func TestAdminSnapshotHook(t *testing.T) {
	e := mastertest.New(t, nil)
	svc := service.New(e.M)
	reg := prometheus.NewRegistry()
	busy := make(chan struct{}, 1)
	h := Handler(e.M, svc, reg, nil, WithSnapshotHook(func(ctx context.Context) (SnapshotInfo, error) {
		select {
		case busy <- struct{}{}:
			<-busy
			return SnapshotInfo{ID: "x", Seq: 7, Size: 100, TookMs: 1.5}, nil
		default:
			return SnapshotInfo{}, fmt.Errorf("%w: a snapshot is running", ErrBusy)
		}
	}))
	do := func(method, remote string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "/snapshot", nil)
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	w := do(http.MethodPost, "127.0.0.1:4000")
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	var info map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &info))
	require.Equal(t, map[string]any{"id": "x", "seq": 7.0, "size": 100.0, "took_ms": 1.5, "longest_pause_ms": 0.0,
		"scratch_longest_hold_ms": 0.0, "scratch_longest_shard_hold_ms": 0.0}, info)
	require.Equal(t, http.StatusMethodNotAllowed, do(http.MethodGet, "127.0.0.1:4000").Code)
	require.Equal(t, http.StatusForbidden, do(http.MethodPost, "10.1.2.3:4000").Code)
	busy <- struct{}{} // one is running
	require.Equal(t, http.StatusConflict, do(http.MethodPost, "[::1]:4000").Code)
	<-busy
}

// TestReportFailedSegmentsService: the RPC, the metrics and the admin
// page show suspect segments.
func TestReportFailedSegmentsService(t *testing.T) {
	e := mastertest.New(t, nil)
	m := e.M
	cli, svc := serve(t, m)
	w, d := mastertest.Client(1), mastertest.Client(2)
	e.Mount(w, "w:1", 64<<20)
	sd := e.Mount(d, "d:1", 64<<20)
	ctx := context.Background()
	resp, err := cli.ReportFailedSegments(ctx, &storepb.ReportFailedSegmentsRequest{ClientId: pbID(w), SegmentIds: []*storepb.UUID{pbID(sd.ID)}})
	require.NoError(t, err)
	assert.Equal(t, uint32(1), resp.Marked)
	_, err = cli.ReportFailedSegments(ctx, &storepb.ReportFailedSegmentsRequest{ClientId: pbID(w), SegmentIds: make([]*storepb.UUID, master.MaxReportSegments+1)})
	assert.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrInvalidParams)
	_, err = cli.ReportFailedSegments(ctx, &storepb.ReportFailedSegmentsRequest{})
	assert.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrInvalidParams)

	reg := prometheus.NewRegistry()
	reg.MustRegister(NewMetrics(m, svc))
	srv := httptest.NewServer(Handler(m, svc, reg, nil))
	defer srv.Close()
	get := func(path string) string {
		r, err := srv.Client().Get(srv.URL + path)
		require.NoError(t, err)
		defer r.Body.Close()
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		return string(b)
	}
	assert.Contains(t, get("/metrics"), "master_suspect_segment_count 1")
	assert.Contains(t, get("/metrics"), "master_report_failed_segments_requests_total 3")
	assert.Contains(t, get("/metrics/summary"), "Suspect segments: 1")
	assert.Contains(t, get("/get_all_segments"), `"suspect": true`)
}

// gather returns the value of every metric of a collector, by name.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				out[mf.GetName()] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestMetricsCountDepartures: the departure counters of
// master.TestCleanUnmountIsNotAnExpiry, as /metrics shows them: a client
// that unmounts its segments left, a silent one expired.
func TestMetricsCountDepartures(t *testing.T) {
	e := mastertest.New(t, nil)
	a, b := mastertest.Client(1), mastertest.Client(2)
	sa := e.Mount(a, "host:a", 1<<20)
	e.Mount(b, "host:b", 1<<20)
	for _, k := range []string{"a1", "a2", "a3"} {
		e.Put(a, k, 1000, master.ReplicateConfig{Preferred: []string{"host:a"}})
	}
	for _, k := range []string{"b1", "b2"} {
		e.Put(b, k, 1000, master.ReplicateConfig{Preferred: []string{"host:b"}})
	}
	require.NoError(t, e.M.UnmountSegment(a, sa.ID))
	e.Clk.Advance(e.M.Config().ClientTTL + 1)
	e.M.Tick()

	mv := gather(t, NewMetrics(e.M, nil))
	require.Equal(t, 1.0, mv["master_expired_clients_total"])
	require.Equal(t, 1.0, mv["master_departed_clients_total"])
	require.Equal(t, 2.0, mv["master_lost_keys_total"])
	require.Equal(t, 2.0, mv["master_dropped_replicas_total"])
	require.Equal(t, 3.0, mv["master_unmounted_keys_total"])
	require.Equal(t, 3.0, mv["master_unmounted_replicas_total"])
	require.Equal(t, 0.0, mv["master_active_clients"])

}

// TestMetricsDurableWait: with a log, /metrics carries per RPC how many
// answers waited for durability and for how long.
func TestMetricsDurableWait(t *testing.T) {
	e := mastertest.New(t, nil)
	const hold = 5 * time.Millisecond
	svc := service.New(e.M, service.WithDurability(func(context.Context) error {
		time.Sleep(hold)
		return nil
	}, func() error { return nil }))
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewMetrics(e.M, svc))
	ic := svc.UnaryInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: storepb.Master_ServiceReady_FullMethodName}
	for range 2 {
		_, err := ic(context.Background(), &storepb.ServiceReadyRequest{}, info, func(context.Context, any) (any, error) {
			return &storepb.ServiceReadyResponse{}, nil
		})
		require.NoError(t, err)
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetCounter() != nil {
				got[mf.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	assert.Equal(t, 2.0, got["master_service_ready_durable_waits_total"])
	assert.GreaterOrEqual(t, got["master_service_ready_durable_wait_seconds_total"], 2*hold.Seconds())
	_, ok := got["master_ping_durable_waits_total"]
	assert.False(t, ok, "an RPC that never waited exports no wait counters")
}

// TestKeyListingsOneAtATime: /get_all_keys requests made together list
// one after another (each holds every key), and each gets every key.
func TestKeyListingsOneAtATime(t *testing.T) {
	e := mastertest.New(t, nil)
	a := mastertest.Client(1)
	e.Mount(a, "seg-a:1", 1<<20)
	for i := range 50 {
		e.Put(a, fmt.Sprintf("k%02d", i), 1000, master.ReplicateConfig{})
	}
	svc := service.New(e.M)
	var in, most atomic.Int32
	first, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	listed := func() {
		n := in.Add(1)
		defer in.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		once.Do(func() {
			close(first)
			<-release
		})
	}
	srv := httptest.NewServer(Handler(e.M, svc, prometheus.NewRegistry(), nil, func(o *options) { o.listed = listed }))
	defer srv.Close()
	var wg sync.WaitGroup
	bodies := make([]string, 4)
	get := func(i int) {
		defer wg.Done()
		resp, err := http.Get(srv.URL + "/get_all_keys")
		if !assert.NoError(t, err) {
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		bodies[i] = string(b)
	}
	wg.Add(1)
	go get(0)
	<-first // the first listing holds its keys
	for i := 1; i < len(bodies); i++ {
		wg.Add(1)
		go get(i)
	}
	time.Sleep(200 * time.Millisecond) // time for the others to start listing, if they could
	close(release)
	wg.Wait()
	require.EqualValues(t, 1, most.Load(), "listings at once")
	for _, b := range bodies {
		require.Equal(t, 50, strings.Count(b, "\n"))
	}
}

// TestKeyListingReaderStalls: a /get_all_keys reader that stops reading
// loses its response after the stall bound, and the listing waiting
// behind it is served (without the bound both wait for ever).
func TestKeyListingReaderStalls(t *testing.T) {
	e := mastertest.New(t, nil)
	a := mastertest.Client(1)
	e.Mount(a, "seg-a:1", 1<<30)
	const n = 100000 // 6 MB of listing: more than the sockets buffer
	for i := range n {
		e.Put(a, fmt.Sprintf("model-7b/layer-%02d/block-%016x/%08d", i%32, i*7919, i), 4096, master.ReplicateConfig{})
	}
	srv := httptest.NewServer(Handler(e.M, service.New(e.M), prometheus.NewRegistry(), nil, func(o *options) { o.listingStall = 300 * time.Millisecond }))
	defer srv.Close()

	stalled, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer stalled.Close()
	_, err = io.WriteString(stalled, "GET /get_all_keys HTTP/1.1\r\nHost: master\r\n\r\n")
	require.NoError(t, err)
	buf := make([]byte, 1024)
	_, err = stalled.Read(buf) // its listing has started; now it reads no more
	require.NoError(t, err)

	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Get(srv.URL + "/get_all_keys")
	require.NoError(t, err, "the second listing waited behind the stalled one")
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, n, strings.Count(string(b), "\n"))
}

// TestSnapshotAnswerOutlastsWriteTimeout: a snapshot longer than the
// port's write timeout (counted from the request) is still answered.
func TestSnapshotAnswerOutlastsWriteTimeout(t *testing.T) {
	e := mastertest.New(t, nil)
	h := Handler(e.M, service.New(e.M), prometheus.NewRegistry(), nil, WithSnapshotHook(func(ctx context.Context) (SnapshotInfo, error) {
		time.Sleep(400 * time.Millisecond)
		return SnapshotInfo{ID: "slow", Seq: 3}, nil
	}))
	srv := httptest.NewUnstartedServer(h)
	srv.Config.WriteTimeout = 100 * time.Millisecond
	srv.Start()
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/snapshot", "", nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	var info SnapshotInfo
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&info))
	require.Equal(t, "slow", info.ID)
}

// bigPings makes sixteen concurrent 1 MiB Pings with cli and returns how
// many failed, each with code want.
func bigPings(t *testing.T, cli storepb.MasterClient, want codes.Code) int64 {
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 16 {
		wg.Go(func() {
			req := &storepb.PingRequest{ClientId: pbID(mastertest.Client(1))}
			req.ProtoReflect().SetUnknown(append([]byte{0xc2, 0x3e, 0x80, 0x80, 0x40}, make([]byte, 1<<20)...)) // field 1000, 1 MiB
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := cli.Ping(ctx, req); err != nil {
				assert.Equal(t, want, status.Code(err), "%v", err)
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	return failed.Load()
}

// metricsOf returns a function that reads the text of /metrics for m and
// svc.
func metricsOf(t *testing.T, m *master.Master, svc *service.Service) func() string {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewMetrics(m, svc))
	srv := httptest.NewServer(Handler(m, svc, reg, nil))
	t.Cleanup(srv.Close)
	return func() string {
		r, err := srv.Client().Get(srv.URL + "/metrics")
		require.NoError(t, err)
		defer r.Body.Close()
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		return string(b)
	}
}

// TestGRPCBoundMetrics: /metrics shows the gRPC request bytes held and
// the calls the byte bound refused: sixteen concurrent 1 MiB calls on one
// connection over a 4 MiB bound, each either answered or refused.
func TestGRPCBoundMetrics(t *testing.T) {
	e := mastertest.New(t, nil)
	cli, svc := serve(t, e.M, service.WithCRPC(crpc.ServerConfig{MaxFrame: 2 << 20, MaxBufferedBytes: 4 << 20, FrameTimeout: 3 * time.Second}, netx.Config{}))
	failed := bigPings(t, cli, codes.Unavailable)
	require.Positive(t, failed, "no call refused: the test proves nothing")
	get := metricsOf(t, e.M, svc)
	require.Eventually(t, func() bool { return strings.Contains(get(), "\nmaster_grpc_request_bytes 0\n") }, 10*time.Second, 10*time.Millisecond)
	assert.Contains(t, get(), fmt.Sprintf("\nmaster_grpc_refused_calls_total %d\n", failed))
	assert.Contains(t, get(), "\nmaster_grpc_starved_conns_total 0\n") // clients that read and open their windows
}

// TestGRPCCallsBoundMetric: the calls the bound on gRPC calls open
// answered RESOURCE_EXHAUSTED are counted on /metrics.
func TestGRPCCallsBoundMetric(t *testing.T) {
	e := mastertest.New(t, nil)
	cli, svc := serve(t, e.M, service.WithCRPC(crpc.ServerConfig{MaxCalls: 1}, netx.Config{}))
	var exhausted int64
	for round := 0; round < 20 && exhausted == 0; round++ {
		exhausted += bigPings(t, cli, codes.ResourceExhausted)
	}
	require.Positive(t, exhausted, "no call past the bound: the test proves nothing")
	assert.Contains(t, metricsOf(t, e.M, svc)(), fmt.Sprintf("\nmaster_grpc_exhausted_calls_total %d\n", exhausted))
}
