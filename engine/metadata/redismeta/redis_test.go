package redismeta_test

import (
	"context"
	"errors"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/metadata/redismeta"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/internal/testsvc/metatest"
)

func TestMain(m *testing.M) {
	metatest.ChildMain()
	goleak.VerifyTestMain(m)
}

// raw reads and writes Redis directly.
type raw struct{ cli *redis.Client }

func newRaw(t testing.TB, addr string, db int) *raw {
	cli := redis.NewClient(&redis.Options{Addr: addr, DB: db})
	t.Cleanup(func() { cli.Close() })
	return &raw{cli}
}

func (r *raw) Get(t testing.TB, key string) ([]byte, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
	defer cancel()
	v, err := r.cli.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return v, true
}

func (r *raw) Put(t testing.TB, key string, val []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
	defer cancel()
	if err := r.cli.Set(ctx, key, val, 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// notifying starts a server with keyspace notifications on; watches then
// must not need polling, so the poll interval is an hour.
func notifying(t *testing.T) (metatest.Config, *testsvc.Redis, *raw) {
	s := testsvc.StartRedis(t, "--notify-keyspace-events", redismeta.NotifyFlags)
	r := newRaw(t, s.Addr, 0)
	return metatest.Config{Conn: s.URL(), Raw: r, Expires: true, Watches: true, PollInterval: time.Hour, TrailingNewline: true}, s, r
}

func TestBackendNotifications(t *testing.T) {
	cfg, _, _ := notifying(t)
	metatest.RunBackend(t, cfg)
}

// Without keyspace notifications the backend polls.
func TestBackendPolling(t *testing.T) {
	s := testsvc.StartRedis(t)
	cfg := metatest.Config{Conn: s.URL(), Raw: newRaw(t, s.Addr, 0), Expires: true, Watches: true, PollInterval: 50 * time.Millisecond, TrailingNewline: true}
	metatest.RunBackend(t, cfg)
}

// A hostile descriptor written straight into the store is refused at
// open time, naming the field; the engine stays usable.
func TestHostileDescriptor(t *testing.T) {
	cfg, _, _ := notifying(t)
	metatest.RunHostile(t, cfg)
}

func TestEngines(t *testing.T) {
	cfg, _, _ := notifying(t)
	metatest.RunEngines(t, cfg)
}

func TestDeadOwnerExpires(t *testing.T) {
	cfg, _, _ := notifying(t)
	metatest.RunDeadOwner(t, cfg)
}

// Entries carry PX = TTL and the owner keeps extending it.
func TestTTLRefreshed(t *testing.T) {
	cfg, _, r := notifying(t)
	b := cfg.Open(t, metadata.Options{TTL: metatest.TTL, RPCAddr: "127.0.0.1:15030"})
	ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
	defer cancel()
	if err := b.Publish(ctx, metatest.Desc("127.0.0.1:15030", 1)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"mooncake/ram/127.0.0.1:15030", "mooncake/rpc_meta/127.0.0.1:15030"} {
		ttl, err := r.cli.PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 || ttl > metatest.TTL {
			t.Fatalf("%s: PTTL %v %v, want (0, %v]", k, ttl, err, metatest.TTL)
		}
	}
	time.Sleep(3 * metatest.TTL) // alive well past the TTL
	if _, ok := r.Get(t, "mooncake/ram/127.0.0.1:15030"); !ok {
		t.Fatal("live owner's descriptor expired")
	}
	// Deleted behind the owner's back (as an expiry during a long
	// outage would): the next refresh publishes it again.
	if err := r.cli.Del(ctx, "mooncake/ram/127.0.0.1:15030", "mooncake/rpc_meta/127.0.0.1:15030").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(metatest.Wait)
	for {
		_, ok1 := r.Get(t, "mooncake/ram/127.0.0.1:15030")
		_, ok2 := r.Get(t, "mooncake/rpc_meta/127.0.0.1:15030")
		if ok1 && ok2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("entries not published again")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A watch survives its pub/sub connection being killed: the
// resubscription reads the key again, so a change made meanwhile is not
// lost even though its event was.
func TestWatchAfterPubSubKilled(t *testing.T) {
	cfg, _, r := notifying(t)
	owner := cfg.Open(t, metadata.Options{})
	watcher := cfg.Open(t, metadata.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
	defer cancel()
	const name = "127.0.0.1:15031"
	if err := owner.Publish(ctx, metatest.Desc(name, 1)); err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 16)
	_, stop := metatest.StartWatch(t, watcher, name)
	defer stop()
	// A second watch on the same key through a fresh log, reading the
	// buffer count.
	wctx, wcancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		watcher.(metadata.Watcher).Watch(wctx, name, func(d *metadata.SegmentDesc) {
			n := -1
			if d != nil {
				n = len(d.Buffers)
			}
			got <- n
		})
	}()
	defer func() { wcancel(); wg.Wait() }()
	if n := <-got; n != 1 {
		t.Fatalf("initial report %d buffers", n)
	}
	if err := r.cli.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	if err := owner.Publish(ctx, metatest.Desc(name, 2)); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-got:
		if n != 2 {
			t.Fatalf("report after reconnect: %d buffers", n)
		}
	case <-time.After(metatest.Wait):
		t.Fatal("change not reported after the pub/sub connection was killed")
	}
}

func TestParseConn(t *testing.T) {
	for _, tc := range []struct {
		conn, env         string
		addr, user, pass  string
		db                int
		tls               bool
		userEnv, passEnvV string
	}{
		{conn: "redis://127.0.0.1:6379", addr: "127.0.0.1:6379"},
		{conn: "redis://h", addr: "h:6379"},
		{conn: "redis://h:7000/3", addr: "h:7000", db: 3},
		{conn: "redis://u:p%40ss@h:7000/2", addr: "h:7000", user: "u", pass: "p@ss", db: 2},
		{conn: "redis://:secret@h:1", addr: "h:1", pass: "secret"},
		{conn: "rediss://h:1", addr: "h:1", tls: true},
		{conn: "redis://h:1", env: "5", addr: "h:1", db: 5, userEnv: "eu", passEnvV: "ep", user: "eu", pass: "ep"},
		{conn: "redis://x:y@h:1/1", env: "5", addr: "h:1", db: 1, userEnv: "eu", passEnvV: "ep", user: "x", pass: "y"},
	} {
		t.Setenv(redismeta.DBIndexEnv, tc.env)
		t.Setenv(redismeta.UsernameEnv, tc.userEnv)
		t.Setenv(redismeta.PasswordEnv, tc.passEnvV)
		o, err := redismeta.ParseConn(tc.conn)
		if err != nil {
			t.Fatalf("%q: %v", tc.conn, err)
		}
		if o.Addr != tc.addr || o.Username != tc.user || o.Password != tc.pass || o.DB != tc.db || (o.TLSConfig != nil) != tc.tls {
			t.Fatalf("%q: addr %q user %q pass %q db %d tls %v", tc.conn, o.Addr, o.Username, o.Password, o.DB, o.TLSConfig != nil)
		}
	}
}

func TestBadConnStrings(t *testing.T) {
	for _, conn := range []string{
		"redis://", "redis://:6379", "redis://h:0", "redis://h:99999", "redis://h:port",
		"redis://h:1/notadb", "redis://h:1/1/2", "redis://h:1?dial_timeout=bogus",
	} {
		if _, err := metadata.Open(conn, metadata.Options{Timeout: time.Second}); !errors.Is(err, metadata.ErrBadConnString) {
			t.Fatalf("Open(%q): %v, want ErrBadConnString", conn, err)
		}
	}
	t.Setenv(redismeta.DBIndexEnv, "256")
	if _, err := metadata.Open("redis://h:1", metadata.Options{Timeout: time.Second}); !errors.Is(err, metadata.ErrBadConnString) {
		t.Fatalf("bad %s: %v", redismeta.DBIndexEnv, err)
	}
	// The password never appears in an error.
	t.Setenv(redismeta.DBIndexEnv, "")
	_, err := metadata.Open("redis://u:hunter2@h:port", metadata.Options{Timeout: time.Second})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error leaks the password or is nil: %v", err)
	}
}

func TestAuthAndDatabase(t *testing.T) {
	s := testsvc.StartRedis(t, "--requirepass", "s3cret", "--notify-keyspace-events", redismeta.NotifyFlags)
	r := redis.NewClient(&redis.Options{Addr: s.Addr, Password: "s3cret", DB: 3})
	t.Cleanup(func() { r.Close() })
	cfg := metatest.Config{Conn: "redis://:s3cret@" + s.Addr + "/3", Raw: &raw{r}, Watches: true, Expires: true, PollInterval: time.Hour, TrailingNewline: true}
	t.Run("url", func(t *testing.T) { metatest.RunBackend(t, cfg) })
	t.Run("env", func(t *testing.T) {
		t.Setenv(redismeta.PasswordEnv, "s3cret")
		t.Setenv(redismeta.DBIndexEnv, "3")
		cfg := cfg
		cfg.Conn = s.URL()
		b := cfg.Open(t, metadata.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
		defer cancel()
		if err := b.Publish(ctx, metatest.Desc("127.0.0.1:15032", 1)); err != nil {
			t.Fatal(err)
		}
		if _, ok := cfg.Raw.Get(t, "mooncake/ram/127.0.0.1:15032"); !ok {
			t.Fatal("not written to db 3")
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		_, err := metadata.Open("redis://:nope@"+s.Addr, metadata.Options{Timeout: time.Second})
		if err == nil || errors.Is(err, metadata.ErrUnavailable) || strings.Contains(err.Error(), "nope") {
			t.Fatalf("wrong password: %v", err)
		}
		t.Log(err)
	})
}

func TestUnreachable(t *testing.T) {
	metatest.RunUnreachable(t, func(addr string) string { return "redis://" + addr })
}

// After the server stops, operations fail within the timeout, and a
// running watch keeps going (and ends when asked).
func TestServerStopped(t *testing.T) {
	cfg, s, _ := notifying(t)
	b := cfg.Open(t, metadata.Options{Timeout: time.Second, RPCAddr: "127.0.0.1:15033"})
	_, stop := metatest.StartWatch(t, b, "127.0.0.1:15033")
	s.Stop()
	start := time.Now()
	if _, err := b.Get(context.Background(), "127.0.0.1:15033"); !errors.Is(err, metadata.ErrUnavailable) {
		t.Fatalf("get on a stopped server: %v", err)
	}
	if err := b.Publish(context.Background(), metatest.Desc("127.0.0.1:15033", 1)); !errors.Is(err, metadata.ErrUnavailable) {
		t.Fatalf("publish on a stopped server: %v", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("took %v with a 1s timeout", d)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("watch: %v", err)
	}
	start = time.Now()
	b.Close() // deletes nothing reachable, but returns
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("close took %v", d)
	}
}

// FuzzParseConn: no panic, errors are ErrBadConnString, and a password
// never appears in one.
func FuzzParseConn(f *testing.F) {
	for _, s := range []string{"redis://127.0.0.1:6379", "redis://u:pw@h:1/2", "rediss://h", "redis://h:1/x", "redis://[::1]:1", "redis://:pw@h:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, conn string) {
		o, err := redismeta.ParseConn(conn)
		if err != nil {
			if !errors.Is(err, metadata.ErrBadConnString) {
				t.Fatalf("%q: error %v is not ErrBadConnString", conn, err)
			}
			if u, perr := url.Parse(conn); perr == nil && u.User != nil {
				if pw, ok := u.User.Password(); ok && len(pw) >= 4 && strings.Contains(err.Error(), pw) {
					t.Fatalf("%q: error leaks the password: %v", conn, err)
				}
			}
			return
		}
		if o.Addr == "" || o.DB < 0 {
			t.Fatalf("%q: parsed to %+v", conn, o)
		}
	})
}

func BenchmarkBackend(b *testing.B) {
	s := testsvc.StartRedis(b)
	metatest.BenchGet(b, metatest.Config{Conn: s.URL(), Raw: newRaw(b, s.Addr, 0)})
}

// TestOversizedValueBounded: a value larger than metadata.MaxDescBytes
// written straight into the store is refused without being read whole;
// a missing key is still not found, and a good one still read.
func TestOversizedValueBounded(t *testing.T) {
	cfg, _, r := notifying(t)
	b := cfg.Open(t, metadata.Options{TTL: metatest.TTL, RPCAddr: "127.0.0.1:15031"})
	ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
	defer cancel()
	const size = 160 << 20
	r.Put(t, "mooncake/ram/127.0.0.1:15032", make([]byte, size))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := b.Get(ctx, "127.0.0.1:15032")
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, metadata.ErrBadDescriptor)
	assert.Contains(t, err.Error(), "holds more than")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(size/2), "a refused value was read whole")

	_, err = b.Get(ctx, "127.0.0.1:15033")
	require.ErrorIs(t, err, metadata.ErrNotFound)
	require.NoError(t, b.Publish(ctx, metatest.Desc("127.0.0.1:15031", 1)))
	d, err := b.Get(ctx, "127.0.0.1:15031")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:15031", d.Name)
}
