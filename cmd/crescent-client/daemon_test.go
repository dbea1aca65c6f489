package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// The daemon runs as a real process: the test binary re-executes itself
// and calls run, exactly as main does.
const daemonEnv = "CRESCENT_CLIENT_DAEMON_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(daemonEnv); ok {
		if v := os.Getenv(availableEnv); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				panic(err)
			}
			availableMemory = func() (mempool.Memory, error) {
				return mempool.Memory{Bytes: n, From: "test limit"}, nil
			}
		}
		setGlobalLog = true // this process is the daemon, as main would run it
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, strings.Split(args, "\x1f"), os.Stdout, os.Stderr)
		stop()
		if code := exitCode(err); code != 0 {
			fmt.Fprintln(os.Stderr, "crescent-client:", err)
			os.Exit(code)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

var quiet = slog.New(slog.DiscardHandler)

// testMaster is a real master served on addr ("127.0.0.1:0" picks one).
type testMaster struct {
	m    *master.Master
	addr string
	stop func()
}

func startMaster(t *testing.T, addr string) *testMaster {
	t.Helper()
	return startMasterToken(t, addr, nil)
}

// startMasterToken is startMaster whose port requires the cluster token
// (nil: none).
func startMasterToken(t *testing.T, addr string, token []byte) *testMaster {
	t.Helper()
	m, err := master.New(master.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	var lis net.Listener
	deadline := time.Now().Add(10 * time.Second)
	for { // the old master's port may take a moment to free
		if lis, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	tm := &testMaster{m: m, addr: lis.Addr().String()}
	done := make(chan struct{})
	if token != nil {
		// The cluster token needs the port as crescent-master serves it
		// (gRPC and crpc behind the challenge).
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			defer close(done)
			service.New(m, service.WithTransportSecurity(nil, token, nil)).Serve(ctx, lis)
		}()
		tm.stop = sync.OnceFunc(func() {
			cancel()
			<-done
			m.Close()
		})
	} else {
		g := grpc.NewServer()
		service.New(m).Register(g)
		go func() {
			defer close(done)
			g.Serve(lis)
		}()
		tm.stop = sync.OnceFunc(func() {
			g.Stop()
			<-done
			m.Close()
		})
	}
	t.Cleanup(tm.stop)
	return tm
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var segLine = regexp.MustCompile(`segment (\S+) \(([0-9a-f]{16})-([0-9a-f]{16}), (\d+) bytes\) mounted`)

// TestDaemon: the daemon as a process against a real master: /health 200;
// the master stops: 503; a new master on the same address: the daemon is
// told NEED_REMOUNT and mounts again; SIGTERM: the segment is unmounted
// and the daemon exits 0.
func TestDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	tm := startMaster(t, "127.0.0.1:0")
	args := []string{"--master_server_address", tm.addr, "--local_hostname", "127.0.0.1", "--global_segment_size", "16 MB",
		"--local_buffer_size", "4 MB", "--metrics_address", "127.0.0.1", "--metrics_port", "0", "--heartbeat_interval", "100ms",
		"--log_level", "error"}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), daemonEnv+"="+strings.Join(args, "\x1f"))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var exitErr error
	var reaped sync.Once
	reap := func() error { reaped.Do(func() { exitErr = <-exited }); return exitErr }
	t.Cleanup(func() {
		cmd.Process.Kill()
		reap()
	})
	sc := bufio.NewScanner(out)
	lines := make(chan string, 16)
	go func() {
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("daemon output ended")
			}
			return l
		case <-time.After(60 * time.Second):
			t.Fatal("no output from the daemon")
		}
		return ""
	}
	sm := segLine.FindStringSubmatch(next())
	if sm == nil {
		t.Fatal("no segment line")
	}
	var id alloc.UUID
	fmt.Sscanf(sm[2]+" "+sm[3], "%x %x", &id.Hi, &id.Lo)
	segName := sm[1]
	url, ok := strings.CutPrefix(next(), "crescent-client: metrics on ")
	if !ok {
		t.Fatal("no metrics line")
	}

	info, err := tm.m.QuerySegmentStatus(id)
	if err != nil || info.Name != segName || info.Capacity != 16<<20 || info.Status != master.SegmentOK {
		t.Fatalf("segment on the master: %+v %v", info, err)
	}
	if code, body := httpGet(t, url+"/health"); code != 200 || strings.TrimSpace(body) != "OK" {
		t.Fatalf("/health: %d %q", code, body)
	}
	code, body := httpGet(t, url+"/metrics")
	for _, m := range []string{
		"crescent_transfer_read_bytes_total 0", "crescent_client_segment_bytes 1.6777216e+07",
		`crescent_client_rpc_count_total{rpc_name="MountSegment"} 1`, "crescent_client_heartbeats_total",
		"crescent_transfer_put_latency_seconds_bucket", "go_goroutines", "process_open_fds",
	} {
		if code != 200 || !strings.Contains(body, m) {
			t.Fatalf("/metrics lacks %q:\n%s", m, body)
		}
	}
	if code, body := httpGet(t, url+"/metrics/summary"); code != 200 || !strings.Contains(body, "=== Transfer Metrics Summary ===") || !strings.Contains(body, "MountSegment:") {
		t.Fatalf("/metrics/summary: %d\n%s", code, body)
	}

	// Data stored in the daemon's memory is readable by another client.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	user, err := store.New(ctx, store.Config{MasterAddr: tm.addr, LocalHostname: "127.0.0.1", LocalBufferSize: 4 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()
	if err := user.Put(ctx, "in-daemon", []byte("kept by the daemon"), store.ReplicateConfig{}); err != nil {
		t.Fatal(err)
	}
	if got, err := user.Get(ctx, "in-daemon"); err != nil || string(got) != "kept by the daemon" {
		t.Fatalf("get: %q %v", got, err)
	}

	// The master goes away: 503.
	tm.stop()
	eventually(t, "/health 503", func() bool { c, _ := httpGet(t, url+"/health"); return c == http.StatusServiceUnavailable })
	// A new master at the same address knows nothing; the daemon re-mounts.
	tm2 := startMaster(t, tm.addr)
	eventually(t, "re-mount on the new master", func() bool {
		info, err := tm2.m.QuerySegmentStatus(id)
		return err == nil && info.Status == master.SegmentOK && info.Name == segName
	})
	if code, _ := httpGet(t, url+"/health"); code != 200 {
		t.Fatalf("/health after the new master: %d", code)
	}
	if _, body := httpGet(t, url+"/metrics"); !strings.Contains(body, "crescent_client_remounts_total 1") {
		t.Fatal("remount not counted")
	}

	// SIGTERM: unmount, then a clean exit.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var rest []string
	for l := range lines {
		rest = append(rest, l)
	}
	if err := reap(); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
	if !strings.Contains(strings.Join(rest, "\n"), "segments unmounted") {
		t.Fatalf("output after SIGTERM: %q", rest)
	}
	if _, err := tm2.m.QuerySegmentStatus(id); !errors.Is(err, errcode.ErrSegmentNotFound) {
		t.Fatalf("segment after SIGTERM: %v", err)
	}
}

// TestHandler checks the HTTP handler in process.
func TestHandler(t *testing.T) {
	tm := startMaster(t, "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := store.New(ctx, store.Config{MasterAddr: tm.addr, LocalHostname: "127.0.0.1", GlobalSegmentSize: 8 << 20, LocalBufferSize: 2 << 20, Logger: quiet,
		PutAhead: -1}) // every put takes PutStart+PutEnd: the counts below are exact
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 5 {
		if err := c.Put(ctx, fmt.Sprint(i), make([]byte, 1000), store.ReplicateConfig{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Get(ctx, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.Get(ctx, "missing")
	srv := &http.Server{Handler: newHandler(c, time.Now().Add(-time.Minute))}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Close()
	url := "http://" + lis.Addr().String()
	_, body := httpGet(t, url+"/metrics")
	for _, m := range []string{
		"crescent_transfer_write_bytes_total 5000", "crescent_transfer_read_bytes_total 5000",
		"crescent_client_put_total 5", "crescent_client_get_total 6", "crescent_client_get_failures_total 1",
		"crescent_transfer_get_latency_seconds_count 6", `crescent_client_rpc_count_total{rpc_name="GetReplicaList"} 6`,
		`crescent_client_rpc_failures_total{rpc_name="GetReplicaList"} 1`, `crescent_client_rpc_latency_seconds_count{rpc_name="PutStart"} 5`,
		`crescent_transfer_put_latency_seconds_bucket{le="+Inf"} 5`,
	} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %q", m)
		}
	}
	_, sum := httpGet(t, url+"/metrics/summary")
	for _, m := range []string{"Total Read: 4.88 KiB", "Puts: 5 (failed 0)   Gets: 6 (failed 1)", "Get: count=6", "PutStart: failures=0, count=5"} {
		if !strings.Contains(sum, m) {
			t.Errorf("summary lacks %q:\n%s", m, sum)
		}
	}
	if code, _ := httpGet(t, url+"/nope"); code != 404 {
		t.Errorf("/nope: %d", code)
	}
	tm.stop()
	if code, body := httpGet(t, url+"/health"); code != 503 || !strings.Contains(body, "RPC_FAIL") {
		t.Errorf("/health without a master: %d %q", code, body)
	}
}
