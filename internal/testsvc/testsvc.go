package testsvc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/crescent-kv/crescent/internal/etcdembed"
	"github.com/crescent-kv/crescent/internal/portpick"
	"github.com/crescent-kv/crescent/internal/redisproc"
	"github.com/crescent-kv/crescent/internal/syncbuf"
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

// FreePort returns a TCP port for a server the test starts on it (see
// portpick: outside the kernel's ephemeral range, never returned twice).
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := portpick.Port()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FreeAddr is "127.0.0.1:port" for a FreePort port: an address nothing
// listens on until the test binds it.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// Redis is a redis-server process on a free 127.0.0.1 port with
// persistence off, stopped by the test's cleanup.
type Redis struct {
	Addr string // 127.0.0.1:port
	s    *redisproc.Server
}

// URL is the server's "redis://127.0.0.1:port" connection string.
func (r *Redis) URL() string { return "redis://" + r.Addr }

// StartRedis starts redis-server with extra arguments (for example
// "--notify-keyspace-events", "K$gx"). It skips or fails the test (see
// MissingDep) when redis-server is not installed.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	s, err := redisproc.Start("", args...)
	if errors.Is(err, redisproc.ErrNotInstalled) {
		MissingDep(t, "redis-server", err)
	}
	if err != nil {
		t.Fatalf("testsvc: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return &Redis{Addr: s.Addr, s: s}
}

// Stop terminates the server and waits for it. It is safe to call more
// than once.
func (r *Redis) Stop() { r.s.Close() }

// Output is what the server printed so far.
func (r *Redis) Output() string { return r.s.Output() }

// Restart stops the server and starts an empty one on the same address.
func (r *Redis) Restart() error { return r.s.Restart() }

// BytesSent is the server's total_net_output_bytes (INFO stats): what it
// has sent to all its clients, so a test can show a reply stayed small.
func (r *Redis) BytesSent(t testing.TB) int64 {
	t.Helper()
	c, err := net.DialTimeout("tcp", r.Addr, 5*time.Second)
	if err != nil {
		t.Fatalf("testsvc: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("INFO stats\r\n")); err != nil {
		t.Fatalf("testsvc: INFO: %v", err)
	}
	br := bufio.NewReader(c)
	head, err := br.ReadString('\n')
	n, perr := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if err != nil || perr != nil || !strings.HasPrefix(head, "$") || n > 1<<20 {
		t.Fatalf("testsvc: INFO reply %q: %v", head, err)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		t.Fatalf("testsvc: INFO: %v", err)
	}
	for _, l := range strings.Split(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(l, "total_net_output_bytes:"); ok {
			if b, err := strconv.ParseInt(v, 10, 64); err == nil {
				return b
			}
		}
	}
	t.Fatalf("testsvc: no total_net_output_bytes in INFO stats")
	return 0
}

// Etcd is an in-process single-member etcd on free 127.0.0.1 ports with
// a temporary data dir, closed by the test's cleanup.
type Etcd struct {
	Endpoint string // 127.0.0.1:port (clients)
	e        *embed.Etcd
	once     sync.Once

	dir                  string // kept for Restart
	clientPort, peerPort int
	logs                 *syncbuf.Buffer
}

// URL is the "etcd://127.0.0.1:port" connection string.
func (e *Etcd) URL() string { return "etcd://" + e.Endpoint }

// StartEtcd starts an embedded etcd server and waits until it serves.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	// The server's log goes to a buffer shown only when the test fails:
	// a clean shutdown logs "errors" about closed listeners.
	logs := &syncbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("embedded etcd log:\n%s", logs.String())
		}
	})
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		dir, cp, pp := t.TempDir(), FreePort(t), FreePort(t)
		e, err := startEtcd(dir, cp, pp, logs)
		if err == nil {
			e.dir, e.clientPort, e.peerPort, e.logs = dir, cp, pp, logs
			t.Cleanup(e.Stop)
			return e
		}
		lastErr = err
	}
	t.Fatalf("testsvc: embedded etcd did not start: %v", lastErr)
	return nil
}

func startEtcd(dir string, clientPort, peerPort int, logs *syncbuf.Buffer) (*Etcd, error) {
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "" // the test log has times
	lg := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(logs), zapcore.WarnLevel))
	e, host, err := etcdembed.Start(etcdembed.Config{Name: "testsvc", Dir: dir, ClientPort: clientPort, PeerPort: peerPort,
		Logger: lg, NoFsync: true})
	if err != nil {
		return nil, err
	}
	return &Etcd{Endpoint: host, e: e}, nil
}

// Restart stops the member and starts it again on the same data dir and
// ports, as a restarted etcd process would (not after Stop).
func (e *Etcd) Restart() error {
	e.e.Close()
	n, err := startEtcd(e.dir, e.clientPort, e.peerPort, e.logs)
	if err != nil {
		return err
	}
	e.e = n.e
	return nil
}

// Stop closes the server; safe to call more than once.
func (e *Etcd) Stop() { e.once.Do(e.e.Close) }

// EtcdCluster is an in-process etcd cluster of several members on free
// 127.0.0.1 ports, closed by the test's cleanup.
type EtcdCluster struct {
	Members   []*embed.Etcd
	Endpoints []string // the members' client host:port, in order
	stopped   []sync.Once
}

// StartEtcdCluster starts an n-member cluster and waits until every
// member serves.
func StartEtcdCluster(t testing.TB, n int) *EtcdCluster {
	t.Helper()
	logs := &syncbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("embedded etcd cluster log:\n%s", logs.String())
		}
	})
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = ""
	lg := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(logs), zapcore.WarnLevel))
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ { // free ports may be taken meanwhile
		cs := make([]etcdembed.Config, n)
		for i := range cs {
			cs[i] = etcdembed.Config{Name: fmt.Sprintf("m%d", i), Dir: t.TempDir(), ClientPort: FreePort(t),
				PeerPort: FreePort(t), Logger: lg, NoFsync: true}
		}
		es, hosts, err := etcdembed.StartCluster(cs)
		if err == nil {
			c := &EtcdCluster{Members: es, Endpoints: hosts, stopped: make([]sync.Once, n)}
			t.Cleanup(c.StopAll)
			return c
		}
		lastErr = err
	}
	t.Fatalf("testsvc: embedded etcd cluster did not start: %v", lastErr)
	return nil
}

// AwaitHTTPQuiet waits, up to limit, until no HTTP connection's
// goroutines are left in the process. Closed etcd members' peer
// connections to each other (etcd's rafthttp) outlive Close by seconds,
// until their read timeouts end them: a package that checks for leaked
// goroutines at its end and runs a cluster test last calls it from a
// cleanup registered before StartEtcdCluster's (so it runs after).
// Useless where the test process keeps HTTP connections of its own.
func AwaitHTTPQuiet(limit time.Duration) {
	buf := make([]byte, 16<<20)
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		st := buf[:runtime.Stack(buf, true)]
		if !bytes.Contains(st, []byte("net/http.(*persistConn)")) && !bytes.Contains(st, []byte("net/http.(*conn).serve")) {
			return
		}
	}
}

// Stop closes member i; safe to call more than once.
func (c *EtcdCluster) Stop(i int) { c.stopped[i].Do(c.Members[i].Close) }

// StopAll closes every member.
func (c *EtcdCluster) StopAll() {
	for i := range c.Members {
		c.Stop(i)
	}
}

// Leader is the index of the member that leads the cluster now (-1 if
// none of the running ones does).
func (c *EtcdCluster) Leader() int {
	for i, m := range c.Members {
		if m.Server.Leader() == m.Server.MemberID() {
			return i
		}
	}
	return -1
}

// GoleakIgnores lists goroutines that may outlive a closed embedded etcd
// server or client by design. With etcd v3.7.3 none was seen (servers
// and clients stop all theirs on Close), so the list is empty; it is
// kept so that test mains need not change when a dependency adds one.
func GoleakIgnores() []goleak.Option { return nil }

// Python returns a Python 3 interpreter for which `-c check` succeeds
// (the Debian one first: `make deps` installs its modules), or skips the
// test (fails it under CRESCENT_REQUIRE_DEPS=1).
func Python(t testing.TB, check string) string {
	t.Helper()
	var last error
	for _, cand := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(cand)
		if err == nil {
			if out, cerr := exec.Command(path, "-c", check).CombinedOutput(); cerr != nil {
				err = fmt.Errorf("%s -c %q: %v: %s", path, check, cerr, bytes.TrimSpace(out))
			}
		}
		if err == nil {
			return path
		}
		last = err
	}
	MissingDep(t, "python3", last)
	return ""
}
