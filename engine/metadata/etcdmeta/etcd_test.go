package etcdmeta_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/metadata/etcdmeta"
	"github.com/crescent-kv/crescent/internal/etcdembed"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/internal/testsvc/metatest"
	"github.com/crescent-kv/crescent/internal/testutil"
)

func TestMain(m *testing.M) {
	metatest.ChildMain()
	bigEtcdChild()
	goleak.VerifyTestMain(m, testsvc.GoleakIgnores()...)
}

// raw reads and writes etcd directly.
type raw struct{ cli *clientv3.Client }

func newRaw(t testing.TB, e *testsvc.Etcd) *raw {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &raw{cli}
}

func (r *raw) Get(t testing.TB, key string) ([]byte, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
	defer cancel()
	resp, err := r.cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false
	}
	return resp.Kvs[0].Value, true
}

func (r *raw) Put(t testing.TB, key string, val []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
	defer cancel()
	if _, err := r.cli.Put(ctx, key, string(val)); err != nil {
		t.Fatal(err)
	}
}

func config(t *testing.T) (metatest.Config, *testsvc.Etcd, *raw) {
	e := testsvc.StartEtcd(t)
	r := newRaw(t, e)
	return metatest.Config{
		Conn: e.URL(), Raw: r, Expires: true, Watches: true,
		PollInterval:    time.Hour, // changes must come from the etcd watch
		TrailingNewline: true,
	}, e, r
}

func TestBackend(t *testing.T) {
	cfg, _, _ := config(t)
	metatest.RunBackend(t, cfg)
}

// A hostile descriptor written straight into the store is refused at
// open time, naming the field; the engine stays usable.
func TestHostileDescriptor(t *testing.T) {
	cfg, _, _ := config(t)
	metatest.RunHostile(t, cfg)
}

func TestEngines(t *testing.T) {
	cfg, _, _ := config(t)
	metatest.RunEngines(t, cfg)
}

func TestDeadOwnerExpires(t *testing.T) {
	cfg, _, _ := config(t)
	metatest.RunDeadOwner(t, cfg)
}

// A bare host:port is etcd, and a list works while one member is down.
func TestConnectionForms(t *testing.T) {
	cfg, e, _ := config(t)
	dead := metatest.DeadAddr(t)
	for _, conn := range []string{e.Endpoint, "etcd://" + e.Endpoint + "," + dead, "etcd://" + dead + ";" + e.Endpoint + "/"} {
		cfg.Conn = conn
		b := cfg.Open(t, metadata.Options{RPCAddr: "127.0.0.1:15020"})
		if _, ok := b.(*etcdmeta.Backend); !ok {
			t.Fatalf("%q opened %T", conn, b)
		}
		ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
		if err := b.Publish(ctx, metatest.Desc("127.0.0.1:15020", 1)); err != nil {
			t.Fatalf("%q: %v", conn, err)
		}
		if _, err := b.Get(ctx, "127.0.0.1:15020"); err != nil {
			t.Fatalf("%q: %v", conn, err)
		}
		cancel()
		b.Close()
	}
}

func TestParseEndpoints(t *testing.T) {
	for _, tc := range []struct {
		conn string
		want []string
	}{
		{"etcd://127.0.0.1:2379", []string{"127.0.0.1:2379"}},
		{"127.0.0.1:2379", []string{"127.0.0.1:2379"}},
		{"etcd://a:1,b:2", []string{"a:1", "b:2"}},
		{"etcd://a:1;b:2/", []string{"a:1", "b:2"}},
		{"etcd://[::1]:2379, b:2", []string{"[::1]:2379", "b:2"}},
	} {
		got, err := etcdmeta.ParseEndpoints(tc.conn)
		if err != nil || len(got) != len(tc.want) {
			t.Fatalf("%q: %v %v", tc.conn, got, err)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%q: %v, want %v", tc.conn, got, tc.want)
			}
		}
	}
}

func TestBadConnStrings(t *testing.T) {
	for _, conn := range []string{
		"etcd://", "etcd://host", "etcd://host:0", "etcd://host:99999", "etcd://:2379",
		"etcd://a:1,", "etcd://a:1,,b", "etcd://u@h:1", "etcd://h:1/path", "localhost", "etcd://h:port",
	} {
		start := time.Now()
		_, err := metadata.Open(conn, metadata.Options{Timeout: time.Second})
		if !errors.Is(err, metadata.ErrBadConnString) {
			t.Fatalf("Open(%q): %v, want ErrBadConnString", conn, err)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Fatalf("Open(%q) took %v to reject a malformed string", conn, d)
		}
	}
}

func TestUnreachable(t *testing.T) {
	metatest.RunUnreachable(t, func(addr string) string { return "etcd://" + addr })
}

// When the lease is lost (here revoked behind the backend's back, as
// expiry during a long partition would), the owner publishes again under
// a new lease.
func TestLeaseLostRepublishes(t *testing.T) {
	cfg, _, r := config(t)
	b := cfg.Open(t, metadata.Options{RPCAddr: "127.0.0.1:15021", TTL: metatest.TTL})
	ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
	defer cancel()
	if err := b.Publish(ctx, metatest.Desc("127.0.0.1:15021", 1)); err != nil {
		t.Fatal(err)
	}
	resp, err := r.cli.Get(ctx, "mooncake/ram/127.0.0.1:15021")
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("published without a lease: %+v %v", resp, err)
	}
	old := clientv3.LeaseID(resp.Kvs[0].Lease)
	if ttl, err := r.cli.TimeToLive(ctx, old); err != nil || ttl.TTL <= 0 {
		t.Fatalf("lease ttl %+v %v", ttl, err)
	}
	if _, err := r.cli.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(metatest.Wait)
	for {
		resp, err := r.cli.Get(ctx, "mooncake/ram/127.0.0.1:15021")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) != old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("descriptor not published again after its lease was lost")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, ok := r.Get(t, "mooncake/rpc_meta/127.0.0.1:15021"); !ok {
		t.Fatal("rpc_meta not published again")
	}
	// And Close revokes the new lease: both keys go at once.
	b.Close()
	for _, k := range []string{"mooncake/ram/127.0.0.1:15021", "mooncake/rpc_meta/127.0.0.1:15021"} {
		if _, ok := r.Get(t, k); ok {
			t.Fatalf("%s left after Close", k)
		}
	}
}

// Operations on a stopped server fail within the timeout instead of
// hanging.
func TestServerStopped(t *testing.T) {
	cfg, e, _ := config(t)
	b := cfg.Open(t, metadata.Options{Timeout: time.Second, RPCAddr: "127.0.0.1:15022"})
	e.Stop()
	start := time.Now()
	_, err := b.Get(context.Background(), "127.0.0.1:15022")
	if !errors.Is(err, metadata.ErrUnavailable) {
		t.Fatalf("get on a stopped server: %v", err)
	}
	if err := b.Publish(context.Background(), metatest.Desc("127.0.0.1:15022", 1)); err == nil {
		t.Fatal("publish on a stopped server succeeded")
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("took %v with a 1s timeout", d)
	}
	b.Close()
}

// FuzzParseEndpoints: no panic, and every accepted endpoint is a
// host:port that parses again on its own.
func FuzzParseEndpoints(f *testing.F) {
	for _, s := range []string{"etcd://127.0.0.1:2379", "a:1,b:2", "etcd://[::1]:1;x:2/", "etcd://", ":1", "etcd://h:1,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, conn string) {
		eps, err := etcdmeta.ParseEndpoints(conn)
		if err != nil {
			if !errors.Is(err, metadata.ErrBadConnString) {
				t.Fatalf("%q: error %v is not ErrBadConnString", conn, err)
			}
			return
		}
		if len(eps) == 0 {
			t.Fatalf("%q: no endpoints and no error", conn)
		}
		for _, ep := range eps {
			if again, err := etcdmeta.ParseEndpoints(ep); err != nil || len(again) != 1 || again[0] != ep {
				t.Fatalf("%q: endpoint %q does not parse alone: %v %v", conn, ep, again, err)
			}
		}
	})
}

func BenchmarkBackend(b *testing.B) {
	e := testsvc.StartEtcd(b)
	metatest.BenchGet(b, metatest.Config{Conn: e.URL(), Raw: newRaw(b, e)})
}

// bigEtcdEnv makes the test binary an etcd allowing requests of
// bigRequest bytes, in a directory of its own, until stdin closes: a
// process apart, so the test counts only the client's allocations.
const (
	bigEtcdEnv = "CRESCENT_TEST_BIG_ETCD_DIR"
	bigRequest = 8 << 20
)

func bigEtcdChild() {
	dir := os.Getenv(bigEtcdEnv)
	if dir == "" {
		return
	}
	e, host, err := etcdembed.Start(etcdembed.Config{Name: "big", Dir: dir, NoFsync: true, MaxRequestBytes: bigRequest, Logger: zap.NewNop()})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Println(host)
	io.Copy(io.Discard, os.Stdin)
	e.Close()
	os.Exit(0)
}

func startBigEtcd(t *testing.T) string {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), bigEtcdEnv+"="+t.TempDir())
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.NotContains(t, line, "error:")
	return strings.TrimSpace(line)
}

// TestOversizedValueBounded: a value past the backend's response bound
// (in an etcd that allows such requests; the bound lowered from
// MaxDescBytes + 1 MiB to 4 MiB so the test moves little) is refused from
// the response's length, not read whole; other descriptors still work.
func TestOversizedValueBounded(t *testing.T) {
	const size = 6 << 20
	defer etcdmeta.SetMaxReply(4 << 20)()
	host := startBigEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{host}, Logger: zap.NewNop(), MaxCallSendMsgSize: bigRequest})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
	defer cancel()
	_, err = cli.Put(ctx, "mooncake/ram/127.0.0.1:15042", string(make([]byte, size)))
	require.NoError(t, err)

	cfg := metatest.Config{Conn: host, Raw: &raw{cli}, PollInterval: time.Hour}
	b := cfg.Open(t, metadata.Options{TTL: metatest.TTL, RPCAddr: "127.0.0.1:15041"})
	var gerr error
	alloc := testutil.Allocated(func() { _, gerr = b.Get(ctx, "127.0.0.1:15042") })
	require.ErrorIs(t, gerr, metadata.ErrBadDescriptor)
	assert.Contains(t, gerr.Error(), "holds more than")
	assert.Less(t, alloc, uint64(size/2), "a refused value was read whole")

	require.NoError(t, b.Publish(ctx, metatest.Desc("127.0.0.1:15041", 1)))
	d, err := b.Get(ctx, "127.0.0.1:15041")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:15041", d.Name)
}
