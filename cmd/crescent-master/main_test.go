package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/crescent-kv/crescent/event"
	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		main() // the crash test's master process
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// startRun runs the master with c in the background; stop cancels it and
// returns run's error (a test error if it does not stop within 30 s).
func startRun(t *testing.T, c config) (ctx context.Context, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, c) }()
	return ctx, func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Error("run did not stop")
			return nil
		}
	}
}

func TestLoadDefaults(t *testing.T) {
	c, err := load(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c != defaults() || c.RPCPort != 50051 || c.MetricsPort != 9003 || c.DefaultKVLeaseTTL != 10000 ||
		c.EvictionHighWatermarkRatio != 0.90 || c.EvictionRatio != 0.05 || c.ClientTTL != 10 || c.AllocationStrategy != "random" ||
		c.RemoveByRegexBudgetMs != 5000 {
		t.Fatalf("defaults %+v", c)
	}
}

func TestLoadYAMLAndFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "master.yaml")
	os.WriteFile(path, []byte("rpc_port: 6000\nclient_ttl: 3\nallocation_strategy: free_ratio_first\neviction_ratio: 0.2\ndata_dir: /var/lib/crescent\n"), 0o600)
	c, err := load([]string{"--config", path, "--client_ttl=7", "--metrics_port", "9100"})
	if err != nil {
		t.Fatal(err)
	}
	// From the file, except where the command line says otherwise.
	if c.RPCPort != 6000 || c.AllocationStrategy != "free_ratio_first" || c.EvictionRatio != 0.2 || c.ClientTTL != 7 || c.MetricsPort != 9100 ||
		c.DataDir != "/var/lib/crescent" {
		t.Fatalf("merged %+v", c)
	}
	// Keys the file leaves out keep their defaults.
	if c.DefaultKVLeaseTTL != 10000 {
		t.Fatalf("lease ttl %d", c.DefaultKVLeaseTTL)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("rpc_port: [1, 2]\n"), 0o600)
	for _, args := range [][]string{
		{"--eviction_ratio", "1.5"},
		{"--eviction_high_watermark_ratio", "0"},
		{"--rpc_port", "70000"},
		{"--allocation_strategy", "round_robin"},
		{"--client_ttl", "0"},
		{"--remove_by_regex_budget_ms", "0"},
		{"--invalidation_ttl_ms", "0"},
		{"--config", filepath.Join(dir, "missing.yaml")},
		{"--config", bad},
		{"--no_such_flag"},
	} {
		if _, err := load(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestRun starts the master as main does, uses its gRPC, admin and
// metadata ports and its KV events, then stops it through its context.
func TestRun(t *testing.T) {
	c := defaults()
	c.RPCAddress, c.HTTPMetadataServerHost = "127.0.0.1", "127.0.0.1"
	c.RPCPort, c.MetricsPort, c.HTTPMetadataServerPort = testsvc.FreePort(t), testsvc.FreePort(t), testsvc.FreePort(t)
	c.EnableHTTPMetadataServer, c.EnableKVEvents = true, true
	evPort, replayPort := testsvc.FreePort(t), testsvc.FreePort(t)
	c.KVEventsEndpoint = "tcp://*:" + strconv.Itoa(evPort)
	c.KVEventsReplayEndpoint = "tcp://*:" + strconv.Itoa(replayPort)
	c.LogLevel = "error"
	ctx, stop := startRun(t, c)

	got := make(chan *event.EventBatch, 16)
	sub, err := event.Subscribe(event.SubscriberConfig{
		Sources: []event.Source{{Endpoint: "tcp://127.0.0.1:" + strconv.Itoa(evPort), ReplayEndpoint: "tcp://127.0.0.1:" + strconv.Itoa(replayPort), StartSeq: event.Ptr(uint64(0))}},
		OnBatch: func(d event.Delivery) { got <- d.Batch },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(c.RPCPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mc := storepb.NewMasterClient(conn)
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	var ready error
	for i := 0; i < 200; i++ {
		if _, ready = mc.ServiceReady(rctx, &storepb.ServiceReadyRequest{}); ready == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ready != nil {
		t.Fatal(ready)
	}
	session, client := newSession()
	seg := &storepb.Segment{Id: &storepb.UUID{High: 3, Low: 4}, Name: "127.0.0.1:1", Base: 1 << 30, Size: 1 << 20, Protocol: "tcp"}
	if _, err := mc.MountSegment(rctx, &storepb.MountSegmentRequest{ClientId: client, Session: session, Segment: seg}); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.PutStart(rctx, &storepb.PutStartRequest{ClientId: client, Session: session, Key: "0x2a", Size: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.PutEnd(rctx, &storepb.PutEndRequest{ClientId: client, Session: session, Key: "0x2a"}); err != nil {
		t.Fatal(err)
	}
	_, err = mc.GetReplicaList(rctx, &storepb.GetReplicaListRequest{Key: "missing"})
	if !errors.Is(rpcerr.FromStatus(err), errcode.ErrObjectNotFound) {
		t.Fatalf("missing key: %v", err)
	}

	httpGet := func(port int, path string) string {
		t.Helper()
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if body := httpGet(c.MetricsPort, "/get_all_keys"); body != "0x2a\n" {
		t.Fatalf("keys %q", body)
	}
	if body := httpGet(c.MetricsPort, "/metrics"); !strings.Contains(body, "master_put_end_requests_total 1") || !strings.Contains(body, "master_rpc_duration_seconds_bucket") {
		t.Fatalf("metrics lack RPC counters")
	}
	// The engine's metadata store answers on its own port.
	req, _ := http.NewRequest(http.MethodPut, "http://127.0.0.1:"+strconv.Itoa(c.HTTPMetadataServerPort)+"/metadata?key=k", strings.NewReader(`{"a":1}`))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("metadata put: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if body := httpGet(c.HTTPMetadataServerPort, "/metadata?key=k"); body != `{"a":1}` {
		t.Fatalf("metadata get %q", body)
	}

	// PutEnd of key 0x2a was published as BlockStored with hash 42.
	select {
	case b := <-got:
		st, ok := b.Events[0].(*event.BlockStored)
		if !ok || st.BlockHashes[0].Value != 42 {
			t.Fatalf("event %#v", b.Events[0])
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no KV event")
	}

	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A data directory another master holds refuses to start, with the
// reason (never a second writer on one log).
func TestRunDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	st, err := oplog.OpenLocal(dir, oplog.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c := defaults()
	c.RPCAddress, c.RPCPort, c.MetricsPort, c.DataDir, c.LogLevel = "127.0.0.1", testsvc.FreePort(t), 0, dir, "error"
	if err := run(context.Background(), c); !errors.Is(err, oplog.ErrLocked) {
		t.Fatalf("run on a held data_dir: %v", err)
	}
}
