package metatest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
)

// Raw reads and writes the backing store directly, bypassing the
// backend, so tests can check what is really stored.
type Raw interface {
	Get(t testing.TB, key string) ([]byte, bool)
	Put(t testing.TB, key string, val []byte)
}

// Config describes the backend under test.
type Config struct {
	Conn string // connection string of a running server
	Raw  Raw
	// Expires: a killed owner's entries disappear after the TTL.
	Expires bool
	// Watches: the backend implements metadata.Watcher.
	Watches bool
	// PollInterval for watches; a long one proves changes arrive by
	// notification rather than polling.
	PollInterval time.Duration
	// TrailingNewline: stored values end with '\n' (etcd and Redis, as
	// the reference's FastWriter; HTTP PUT bodies do not).
	TrailingNewline bool
}

// Wait is the bound of every "eventually" condition: generous, because
// a loaded 2-core machine under -race is slow.
const Wait = 30 * time.Second

// TTL is the entry lifetime the expiry tests use.
const TTL = 2 * time.Second

// Open opens the backend of cfg with test defaults and closes it in the
// test's cleanup.
func (cfg Config) Open(t testing.TB, opts metadata.Options) metadata.Backend {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = cfg.PollInterval
	}
	b, err := metadata.Open(cfg.Conn, opts)
	if err != nil {
		t.Fatalf("open %s: %v", cfg.Conn, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// Desc returns a valid tcp descriptor named name.
func Desc(name string, buffers int) *metadata.SegmentDesc {
	d := &metadata.SegmentDesc{
		Name: name, Protocol: "tcp", TCPDataPort: 15999, TCPProtoVersion: 2,
		Timestamp: metadata.Timestamp(time.Now()),
	}
	for i := range buffers {
		d.Buffers = append(d.Buffers, metadata.Buffer{Name: "cpu:0", Addr: 0x7f0000000000 + uint64(i)<<24, Length: 1 << 20})
	}
	return d
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), Wait)
	t.Cleanup(cancel)
	return c
}

func (cfg Config) wantValue(t testing.TB, key string, want []byte) {
	t.Helper()
	got, ok := cfg.Raw.Get(t, key)
	if !ok {
		t.Fatalf("key %q absent", key)
	}
	if !cfg.TrailingNewline {
		want = bytes.TrimSuffix(want, []byte("\n"))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("key %q holds %q, want %q", key, got, want)
	}
}

func (cfg Config) wantAbsent(t testing.TB, key string) {
	t.Helper()
	if v, ok := cfg.Raw.Get(t, key); ok {
		t.Fatalf("key %q still holds %q", key, v)
	}
}

func sameDesc(t testing.TB, got, want *metadata.SegmentDesc) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if !bytes.Equal(g, w) {
		t.Fatalf("descriptor\n got %s\nwant %s", g, w)
	}
}

// RunBackend runs the backend-level tests.
func RunBackend(t *testing.T, cfg Config) {
	t.Run("RoundTripAndKeyNames", func(t *testing.T) { roundTrip(t, cfg) })
	t.Run("ClusterID", func(t *testing.T) { clusterID(t, cfg) })
	t.Run("HostNameSegment", func(t *testing.T) { hostNameSegment(t, cfg) })
	t.Run("CorruptValues", func(t *testing.T) { corrupt(t, cfg) })
	t.Run("CloseRemoves", func(t *testing.T) { closeRemoves(t, cfg) })
	t.Run("ConcurrentUse", func(t *testing.T) { concurrent(t, cfg) })
	if cfg.Watches {
		t.Run("Watch", func(t *testing.T) { watch(t, cfg) })
	}
}

func roundTrip(t *testing.T, cfg Config) {
	b := cfg.Open(t, metadata.Options{RPCAddr: "127.0.0.1:15001"})
	reader := cfg.Open(t, metadata.Options{})
	c := ctx(t)
	const name = "127.0.0.1:15001"
	if _, err := reader.Get(c, name); !errors.Is(err, metadata.ErrNotFound) {
		t.Fatalf("get before publish: %v, want ErrNotFound", err)
	}
	if _, err := reader.RPCAddr(c, name); !errors.Is(err, metadata.ErrNotFound) {
		t.Fatalf("rpc addr before publish: %v, want ErrNotFound", err)
	}
	d := Desc(name, 2)
	if err := b.Publish(c, d); err != nil {
		t.Fatal(err)
	}
	got, err := reader.Get(c, name)
	if err != nil {
		t.Fatal(err)
	}
	sameDesc(t, got, d)
	// Exactly the reference's keys and value formats.
	want, _ := d.Marshal()
	cfg.wantValue(t, "mooncake/ram/"+name, want)
	cfg.wantValue(t, "mooncake/rpc_meta/"+name, []byte(`{"ip_or_host_name":"127.0.0.1","rpc_port":15001}`+"\n"))
	if addr, err := reader.RPCAddr(c, name); err != nil || addr != "127.0.0.1:15001" {
		t.Fatalf("rpc addr %q %v", addr, err)
	}
	// A republished descriptor replaces the old one.
	d2 := Desc(name, 3)
	if err := b.Publish(c, d2); err != nil {
		t.Fatal(err)
	}
	if got, err := reader.Get(c, name); err != nil || len(got.Buffers) != 3 {
		t.Fatalf("after republish: %+v %v", got, err)
	}
	// Invalid descriptors are refused before anything is written.
	bad := Desc("127.0.0.1:15002", 1)
	bad.Buffers[0].Addr = 0
	if err := b.Publish(c, bad); !errors.Is(err, metadata.ErrBadDescriptor) {
		t.Fatalf("publish of a bad descriptor: %v", err)
	}
	cfg.wantAbsent(t, "mooncake/ram/127.0.0.1:15002")

	if err := b.Remove(c, name); err != nil {
		t.Fatal(err)
	}
	cfg.wantAbsent(t, "mooncake/ram/"+name)
	cfg.wantAbsent(t, "mooncake/rpc_meta/"+name)
	if _, err := reader.Get(c, name); !errors.Is(err, metadata.ErrNotFound) {
		t.Fatalf("get after remove: %v", err)
	}
	if err := b.Remove(c, name); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	// A closed backend refuses work with an error, not a hang.
	b.Close()
	if err := b.Publish(c, d); err == nil {
		t.Fatal("publish on a closed backend succeeded")
	}
}

func clusterID(t *testing.T, cfg Config) {
	c := ctx(t)
	for _, tc := range []struct{ opt, env, prefix string }{
		{opt: "c1", prefix: "mooncake/c1/"},
		{opt: "c2/", prefix: "mooncake/c2/"},
		{env: "envcluster", prefix: "mooncake/envcluster/"},
	} {
		t.Setenv(metadata.ClusterIDEnv, tc.env)
		b := cfg.Open(t, metadata.Options{ClusterID: tc.opt, RPCAddr: "127.0.0.1:15003"})
		d := Desc("127.0.0.1:15003", 1)
		if err := b.Publish(c, d); err != nil {
			t.Fatal(err)
		}
		want, _ := d.Marshal()
		cfg.wantValue(t, tc.prefix+"ram/127.0.0.1:15003", want)
		cfg.wantValue(t, tc.prefix+"rpc_meta/127.0.0.1:15003", []byte(`{"ip_or_host_name":"127.0.0.1","rpc_port":15003}`+"\n"))
		cfg.wantAbsent(t, "mooncake/ram/127.0.0.1:15003")
		// Another cluster does not see it.
		other := cfg.Open(t, metadata.Options{ClusterID: "elsewhere"})
		if _, err := other.Get(c, "127.0.0.1:15003"); !errors.Is(err, metadata.ErrNotFound) {
			t.Fatalf("other cluster sees the segment: %v", err)
		}
		if err := b.Remove(c, "127.0.0.1:15003"); err != nil {
			t.Fatal(err)
		}
	}
}

// hostNameSegment: a segment named by host only (as reference peers in
// store mode are) is reached through its rpc_meta entry, and a name with
// '/' is its own key under the prefix.
func hostNameSegment(t *testing.T, cfg Config) {
	c := ctx(t)
	b := cfg.Open(t, metadata.Options{RPCAddr: "127.0.0.7:16001"})
	d := Desc("node-a", 1)
	if err := b.Publish(c, d); err != nil {
		t.Fatal(err)
	}
	got, err := b.Get(c, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if got.TCPDataHost != "127.0.0.7" {
		t.Fatalf("tcp_data_host %q, want the rpc_meta host 127.0.0.7", got.TCPDataHost)
	}
	if addr, err := b.RPCAddr(c, "node-a"); err != nil || addr != "127.0.0.7:16001" {
		t.Fatalf("rpc addr %q %v", addr, err)
	}
	slash := Desc("pool/seg-1", 1)
	if err := b.Publish(c, slash); err != nil {
		t.Fatal(err)
	}
	want, _ := slash.Marshal()
	cfg.wantValue(t, "mooncake/pool/seg-1", want)
	cfg.wantValue(t, "mooncake/rpc_meta/pool/seg-1", []byte(`{"ip_or_host_name":"127.0.0.7","rpc_port":16001}`+"\n"))
	if _, err := b.Get(c, "pool/seg-1"); err != nil {
		t.Fatal(err)
	}
	b.Remove(c, "node-a")
	b.Remove(c, "pool/seg-1")
}

func corrupt(t *testing.T, cfg Config) {
	c := ctx(t)
	b := cfg.Open(t, metadata.Options{})
	for i, v := range []string{"not json", "null", `{"name":"x","protocol":"tcp","buffers":[{"name":"cpu:0","addr":0,"length":1}]}`, `{"name":"x","buffers":[{"name":"a","addr":"1","length":1}]}`} {
		name := fmt.Sprintf("127.0.0.1:%d", 17000+i)
		cfg.Raw.Put(t, "mooncake/ram/"+name, []byte(v))
		if _, err := b.Get(c, name); !errors.Is(err, metadata.ErrBadDescriptor) {
			t.Fatalf("value %q: %v, want ErrBadDescriptor", v, err)
		}
	}
	for _, v := range []string{"{", `{"ip_or_host_name":"h"}`, `{"ip_or_host_name":"","rpc_port":1}`, `{"ip_or_host_name":"h","rpc_port":70000}`} {
		cfg.Raw.Put(t, "mooncake/rpc_meta/bad", []byte(v))
		if _, err := b.RPCAddr(c, "bad"); !errors.Is(err, metadata.ErrBadReply) {
			t.Fatalf("rpc_meta %q: %v, want ErrBadReply", v, err)
		}
	}
	// A reference peer's rpc_meta, as its FastWriter writes it.
	cfg.Raw.Put(t, "mooncake/rpc_meta/ref", []byte("{\"ip_or_host_name\":\"10.1.2.3\",\"rpc_port\":15123}\n"))
	if addr, err := b.RPCAddr(c, "ref"); err != nil || addr != "10.1.2.3:15123" {
		t.Fatalf("reference rpc_meta: %q %v", addr, err)
	}
}

func closeRemoves(t *testing.T, cfg Config) {
	c := ctx(t)
	b := cfg.Open(t, metadata.Options{RPCAddr: "127.0.0.1:15004"})
	if err := b.Publish(c, Desc("127.0.0.1:15004", 1)); err != nil {
		t.Fatal(err)
	}
	if _, ok := cfg.Raw.Get(t, "mooncake/ram/127.0.0.1:15004"); !ok {
		t.Fatal("not published")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	cfg.wantAbsent(t, "mooncake/ram/127.0.0.1:15004")
	cfg.wantAbsent(t, "mooncake/rpc_meta/127.0.0.1:15004")
}

func concurrent(t *testing.T, cfg Config) {
	c := ctx(t)
	b := cfg.Open(t, metadata.Options{RPCAddr: "127.0.0.1:15005"})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("127.0.0.1:%d", 15100+g)
			for i := range 5 {
				if err := b.Publish(c, Desc(name, 1+i%3)); err != nil {
					errs <- err
					return
				}
				if _, err := b.Get(c, name); err != nil {
					errs <- err
					return
				}
			}
			if err := b.Remove(c, name); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// watchLog collects what a Watch reports.
type watchLog struct {
	mu  sync.Mutex
	got []*metadata.SegmentDesc
	ch  chan struct{}
}

func newWatchLog() *watchLog { return &watchLog{ch: make(chan struct{}, 1)} }

func (w *watchLog) fn(d *metadata.SegmentDesc) {
	w.mu.Lock()
	w.got = append(w.got, d)
	w.mu.Unlock()
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// waitFor waits until the latest report satisfies ok.
func (w *watchLog) waitFor(t testing.TB, what string, ok func(*metadata.SegmentDesc) bool) {
	t.Helper()
	deadline := time.After(Wait)
	for {
		w.mu.Lock()
		n := len(w.got)
		var last *metadata.SegmentDesc
		if n > 0 {
			last = w.got[n-1]
		}
		w.mu.Unlock()
		if n > 0 && ok(last) {
			return
		}
		select {
		case <-w.ch:
		case <-deadline:
			t.Fatalf("watch: %s not reported within %v (%d reports)", what, Wait, n)
		}
	}
}

func isNil(d *metadata.SegmentDesc) bool { return d == nil }

func buffers(n int) func(*metadata.SegmentDesc) bool {
	return func(d *metadata.SegmentDesc) bool { return d != nil && len(d.Buffers) == n }
}

// StartWatch runs b.Watch on name until the test ends and returns its
// log and a function that stops it and returns Watch's error.
func StartWatch(t testing.TB, b metadata.Backend, name string) (*watchLog, func() error) {
	t.Helper()
	w, ok := b.(metadata.Watcher)
	if !ok {
		t.Fatalf("%T does not implement metadata.Watcher", b)
	}
	log := newWatchLog()
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Watch(wctx, name, log.fn) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(Wait):
				err = errors.New("Watch did not return after its context ended")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return log, stop
}

func watch(t *testing.T, cfg Config) {
	c := ctx(t)
	owner := cfg.Open(t, metadata.Options{RPCAddr: "127.0.0.1:15006"})
	watcher := cfg.Open(t, metadata.Options{})
	const name = "127.0.0.1:15006"
	log, stop := StartWatch(t, watcher, name)
	log.waitFor(t, "initial absence", isNil)
	if err := owner.Publish(c, Desc(name, 1)); err != nil {
		t.Fatal(err)
	}
	log.waitFor(t, "publish", buffers(1))
	if err := owner.Publish(c, Desc(name, 2)); err != nil {
		t.Fatal(err)
	}
	log.waitFor(t, "change", buffers(2))
	if err := owner.Remove(c, name); err != nil {
		t.Fatal(err)
	}
	log.waitFor(t, "removal", isNil)
	// A value that does not decode is skipped, not reported.
	cfg.Raw.Put(t, "mooncake/ram/"+name, []byte("garbage"))
	if err := owner.Publish(c, Desc(name, 3)); err != nil {
		t.Fatal(err)
	}
	log.waitFor(t, "publish after garbage", buffers(3))
	log.mu.Lock()
	for i, d := range log.got {
		if d != nil && len(d.Buffers) == 0 {
			t.Errorf("report %d is an empty descriptor", i)
		}
	}
	log.mu.Unlock()
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch returned %v after cancel, want context.Canceled", err)
	}
	// Closing the backend ends a running watch.
	w2 := cfg.Open(t, metadata.Options{})
	_, stop2 := StartWatch(t, w2, name)
	w2.Close()
	if err := stop2(); err == nil {
		t.Fatal("Watch on a closed backend returned nil")
	}
}

// Child-process owner for the expiry test.
const (
	childEnv     = "CRESCENT_METATEST_OWNER"
	childTTLEnv  = "CRESCENT_METATEST_TTL"
	childNameEnv = "CRESCENT_METATEST_NAME"
)

// ChildMain turns the test binary into a publishing owner when it was
// started as one by RunDeadOwner. Call it first in TestMain.
func ChildMain() {
	conn := os.Getenv(childEnv)
	if conn == "" {
		return
	}
	ttl, _ := time.ParseDuration(os.Getenv(childTTLEnv))
	name := os.Getenv(childNameEnv)
	b, err := metadata.Open(conn, metadata.Options{TTL: ttl, RPCAddr: name, Timeout: 10 * time.Second})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Publish(ctx, Desc(name, 1)); err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // until the parent goes away
	os.Exit(0)
}

// RunDeadOwner kills (SIGKILL) a process that published a descriptor and
// checks what happens to its entries: with Expires they vanish within the
// TTL and watchers see nil; without, they stay.
func RunDeadOwner(t *testing.T, cfg Config) {
	const name = "127.0.0.1:15009"
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+cfg.Conn, childTTLEnv+"="+TTL.String(), childNameEnv+"="+name)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		stdin.Close()
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case l := <-line:
		if l != "ready" {
			t.Fatalf("owner process: %q", l)
		}
	case <-time.After(Wait):
		t.Fatal("owner process did not publish")
	}
	c := ctx(t)
	b := cfg.Open(t, metadata.Options{})
	if cfg.Expires {
		// Alive for several TTLs: the owner keeps its entries.
		time.Sleep(2 * TTL)
	}
	if _, err := b.Get(c, name); err != nil {
		t.Fatalf("live owner's descriptor: %v", err)
	}
	var log *watchLog
	if cfg.Watches {
		log, _ = StartWatch(t, b, name)
		log.waitFor(t, "live descriptor", buffers(1))
	}
	cmd.Process.Kill()
	cmd.Wait()
	killed = true
	if !cfg.Expires {
		time.Sleep(TTL)
		if _, err := b.Get(c, name); err != nil {
			t.Fatalf("without TTL a dead owner's entry stays until removed; got %v", err)
		}
		b.Remove(c, name)
		return
	}
	killedAt := time.Now()
	deadline := time.Now().Add(Wait)
	for {
		_, err := b.Get(c, name)
		if errors.Is(err, metadata.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead owner's descriptor still there %v after the kill (TTL %v): %v", Wait, TTL, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("descriptor expired %v after the owner was killed (TTL %v)", time.Since(killedAt).Round(100*time.Millisecond), TTL)
	if _, err := b.RPCAddr(c, name); !errors.Is(err, metadata.ErrNotFound) {
		t.Fatalf("dead owner's rpc_meta: %v", err)
	}
	if log != nil {
		log.waitFor(t, "expiry", isNil)
	}
}

// BenchGet measures Get of a published 8-buffer descriptor (one store
// round trip plus decoding) and Publish of it.
func BenchGet(b *testing.B, cfg Config) {
	be := cfg.Open(b, metadata.Options{RPCAddr: "127.0.0.1:15050"})
	c, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	d := Desc("127.0.0.1:15050", 8)
	val, _ := d.Marshal()
	b.Run("Publish", func(b *testing.B) {
		b.SetBytes(int64(len(val)))
		b.ReportAllocs()
		for b.Loop() {
			if err := be.Publish(c, d); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Get", func(b *testing.B) {
		b.SetBytes(int64(len(val)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := be.Get(c, d.Name); err != nil {
				b.Fatal(err)
			}
		}
	})
}
