package testsvc

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// RequireDepsEnv, when "1", turns a missing external program into a test
// failure instead of a skip (make test sets it).
const RequireDepsEnv = "CRESCENT_REQUIRE_DEPS"

// MissingDep skips the test (or fails it under CRESCENT_REQUIRE_DEPS=1)
// because an external program is not installed.
func MissingDep(t testing.TB, what string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s not available (%v); run `make deps`", what, err)
	if os.Getenv(RequireDepsEnv) == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// Callers that bind it later retry on a collision.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// syncBuffer collects a child's output for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Redis is a redis-server process on a free 127.0.0.1 port with
// persistence off, stopped by the test's cleanup.
type Redis struct {
	Addr string // 127.0.0.1:port
	cmd  *exec.Cmd
	out  *syncBuffer
	once sync.Once
	done chan struct{}
}

// URL is the server's "redis://127.0.0.1:port" connection string.
func (r *Redis) URL() string { return "redis://" + r.Addr }

// StartRedis starts redis-server with extra arguments (for example
// "--notify-keyspace-events", "K$gx"). It skips or fails the test (see
// MissingDep) when redis-server is not installed.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		MissingDep(t, "redis-server", err)
	}
	dir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port := FreePort(t)
		r, err := startRedis(bin, dir, port, args)
		if err == nil {
			t.Cleanup(r.Stop)
			return r
		}
		lastErr = err
	}
	t.Fatalf("testsvc: redis-server did not start: %v", lastErr)
	return nil
}

func startRedis(bin, dir string, port int, args []string) (*Redis, error) {
	argv := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--daemonize", "no", "--logfile", "", "--protected-mode", "yes",
	}, args...)
	r := &Redis{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), out: &syncBuffer{}, done: make(chan struct{})}
	r.cmd = exec.Command(bin, argv...)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := ping(r.Addr); err == nil {
			return r, nil
		}
		select {
		case <-r.done:
			return nil, fmt.Errorf("redis-server exited: %s", r.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.Stop()
			return nil, fmt.Errorf("redis-server on %s not answering: %s", r.Addr, r.out.String())
		}
	}
}

// ping sends a RESP PING and expects +PONG (or -NOAUTH).
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	// NOAUTH: up, with --requirepass.
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Stop terminates the server (SIGTERM, then SIGKILL after 10s) and waits
// for it. It is safe to call more than once.
func (r *Redis) Stop() {
	r.once.Do(func() {
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			r.cmd.Process.Kill()
			<-r.done
		}
	})
}

// Output is what the server printed so far.
func (r *Redis) Output() string { return r.out.String() }

// Etcd is an in-process single-member etcd on free 127.0.0.1 ports with
// a temporary data dir, closed by the test's cleanup.
type Etcd struct {
	Endpoint string // 127.0.0.1:port (clients)
	e        *embed.Etcd
	once     sync.Once
}

// URL is the "etcd://127.0.0.1:port" connection string.
func (e *Etcd) URL() string { return "etcd://" + e.Endpoint }

// StartEtcd starts an embedded etcd server and waits until it serves.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	// The server's log goes to a buffer shown only when the test fails:
	// a clean shutdown logs "errors" about closed listeners.
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("embedded etcd log:\n%s", logs.String())
		}
	})
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		e, err := startEtcd(t.TempDir(), FreePort(t), FreePort(t), logs)
		if err == nil {
			t.Cleanup(e.Stop)
			return e
		}
		lastErr = err
	}
	t.Fatalf("testsvc: embedded etcd did not start: %v", lastErr)
	return nil
}

func startEtcd(dir string, clientPort, peerPort int, logs *syncBuffer) (*Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "testsvc"
	cfg.Dir = dir
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "" // the test log has times
	lg := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(logs), zapcore.WarnLevel))
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	cfg.UnsafeNoFsync = true // a throwaway data dir
	cu := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))}
	pu := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("etcd on %s not ready after 60s", cu.Host)
	}
	return &Etcd{Endpoint: cu.Host, e: e}, nil
}

// Stop closes the server; safe to call more than once.
func (e *Etcd) Stop() { e.once.Do(e.e.Close) }

// GoleakIgnores lists goroutines that may outlive a closed embedded etcd
// server or client by design. With etcd v3.7.3 none was seen (servers
// and clients stop all theirs on Close), so the list is empty; it is
// kept so that test mains need not change when a dependency adds one.
func GoleakIgnores() []goleak.Option { return nil }
