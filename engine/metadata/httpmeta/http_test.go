package httpmeta_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/metadata/httpmeta"
	"github.com/crescent-kv/crescent/internal/testsvc/metatest"
)

func TestMain(m *testing.M) {
	metatest.ChildMain()
	goleak.VerifyTestMain(m)
}

// raw reads and writes the served store directly.
type raw struct{ st *httpmeta.Store }

func (r raw) Get(t testing.TB, key string) ([]byte, bool) { return r.st.Get(key) }
func (r raw) Put(t testing.TB, key string, val []byte) {
	if err := r.st.Put(key, val); err != nil {
		t.Fatal(err)
	}
}

func serve(t *testing.T) *httpmeta.Server {
	s, err := httpmeta.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func config(t *testing.T) (metatest.Config, *httpmeta.Server) {
	s := serve(t)
	return metatest.Config{Conn: s.URL(), Raw: raw{s.Store()}}, s
}

func TestBackend(t *testing.T) {
	cfg, _ := config(t)
	metatest.RunBackend(t, cfg)
}

// A hostile descriptor written straight into the store is refused at
// open time, naming the field; the engine stays usable.
func TestHostileDescriptor(t *testing.T) {
	cfg, _ := config(t)
	metatest.RunHostile(t, cfg)
}

func TestEngines(t *testing.T) {
	cfg, _ := config(t)
	metatest.RunEngines(t, cfg)
}

// Plain HTTP has no TTL: a killed owner's entries stay until removed.
func TestDeadOwnerStays(t *testing.T) {
	cfg, _ := config(t)
	metatest.RunDeadOwner(t, cfg)
}

func do(t *testing.T, h http.Handler, method, target string, body []byte) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, target, rd))
	return w.Code, w.Body.String()
}

// The reference's protocol, status by status.
func TestHandler(t *testing.T) {
	h := httpmeta.Handler()
	type step struct {
		method, target, body string
		code                 int
		reply                string
	}
	for i, s := range []step{
		{"GET", "/metadata?key=mooncake%2Fram%2Fa", "", 404, "metadata not found"},
		{"PUT", "/metadata?key=mooncake%2Fram%2Fa", `{"name":"a"}` + "\n", 200, "metadata updated"},
		{"GET", "/metadata?key=mooncake/ram/a", "", 200, `{"name":"a"}` + "\n"},
		{"HEAD", "/metadata?key=mooncake/ram/a", "", 200, ""},
		{"PUT", "/metadata?key=mooncake/ram/a", `{"name":"b"}`, 200, "metadata updated"},
		{"GET", "/metadata?key=mooncake/ram/a", "", 200, `{"name":"b"}`},
		{"PUT", "/metadata?key=k+with%26odd%3D", "v", 200, "metadata updated"},
		{"GET", "/metadata?key=k%20with%26odd%3D", "", 200, "v"},
		{"PUT", "/metadata?key=empty", "", 200, "metadata updated"},
		{"GET", "/metadata?key=empty", "", 200, ""},
		{"DELETE", "/metadata?key=mooncake/ram/a", "", 200, "metadata deleted"},
		{"DELETE", "/metadata?key=mooncake/ram/a", "", 404, "metadata not found"},
		{"GET", "/metadata?key=mooncake/ram/a", "", 404, "metadata not found"},
		{"GET", "/metadata", "", 400, "Missing key parameter"},
		{"PUT", "/metadata?key=", "x", 400, "Missing key parameter"},
		{"DELETE", "/metadata?other=1", "", 400, "Missing key parameter"},
		{"POST", "/metadata?key=a", "x", 405, "method not allowed"},
		{"PUT", "/metadata?key=" + strings.Repeat("k", 5000), "x", 400, "key too long"},
	} {
		var body []byte
		if s.body != "" || s.method == "PUT" {
			body = []byte(s.body)
		}
		code, reply := do(t, h, s.method, s.target, body)
		if code != s.code || reply != s.reply {
			t.Fatalf("step %d %s %s: %d %q, want %d %q", i, s.method, s.target, code, reply, s.code, s.reply)
		}
	}
}

func TestStoreLimits(t *testing.T) {
	st := httpmeta.NewStore(httpmeta.StoreOptions{MaxValueBytes: 100, MaxKeys: 3, MaxBytes: 250, MaxKeyBytes: 10})
	if code, _ := do(t, st, "PUT", "/metadata?key=a", make([]byte, 101)); code != 413 {
		t.Fatalf("oversize body: %d", code)
	}
	// A body without Content-Length is cut at the limit too.
	w := httptest.NewRecorder()
	r := httptest.NewRequest("PUT", "/metadata?key=a", io.MultiReader(bytes.NewReader(make([]byte, 60)), bytes.NewReader(make([]byte, 60))))
	r.ContentLength = -1
	st.ServeHTTP(w, r)
	if w.Code != 413 {
		t.Fatalf("oversize chunked body: %d", w.Code)
	}
	for _, k := range []string{"a", "b", "c"} {
		if code, _ := do(t, st, "PUT", "/metadata?key="+k, make([]byte, 50)); code != 200 {
			t.Fatalf("put %s: %d", k, code)
		}
	}
	if code, _ := do(t, st, "PUT", "/metadata?key=d", []byte("x")); code != 507 {
		t.Fatalf("fourth key: %d, want 507", code)
	}
	// Replacing a value counts only the difference; the byte cap holds.
	if code, _ := do(t, st, "PUT", "/metadata?key=a", make([]byte, 100)); code != 200 {
		t.Fatalf("grow a: %d", code)
	}
	if code, _ := do(t, st, "PUT", "/metadata?key=b", make([]byte, 100)); code != 507 {
		t.Fatalf("over the byte cap: %d, want 507", code)
	}
	if err := st.Put("", nil); !errors.Is(err, httpmeta.ErrEmptyKey) {
		t.Fatal(err)
	}
	if err := st.Put("01234567890", nil); !errors.Is(err, httpmeta.ErrKeyTooLong) {
		t.Fatal(err)
	}
	st.Delete("a")
	if code, _ := do(t, st, "PUT", "/metadata?key=d", []byte("x")); code != 200 {
		t.Fatalf("after delete: %d", code)
	}
	if got := st.Keys(""); len(got) != 3 || got[0] != "b" || got[2] != "d" || st.Len() != 3 {
		t.Fatalf("keys %v", got)
	}
	// Stored values are copies.
	v := []byte("abc")
	st.Delete("b")
	st.Put("b", v)
	v[0] = 'X'
	if got, _ := st.Get("b"); string(got) != "abc" {
		t.Fatalf("store aliases the caller's slice: %q", got)
	}
}

func TestStoreConcurrent(t *testing.T) {
	s := serve(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				key := url.QueryEscape(fmt.Sprintf("k/%d/%d", g, i%5))
				base := "http://" + s.Addr() + "/metadata?key=" + key
				req, _ := http.NewRequest("PUT", base, strings.NewReader(fmt.Sprint(i)))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					errs <- err
					return
				}
				resp.Body.Close()
				resp, err = http.Get(base)
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != fmt.Sprint(i) {
					errs <- fmt.Errorf("read %q after writing %d", b, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	http.DefaultClient.CloseIdleConnections()
	if s.Store().Len() != 40 {
		t.Fatalf("%d keys", s.Store().Len())
	}
}

func TestServeHealthAndClose(t *testing.T) {
	s, err := httpmeta.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + s.Addr() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "OK" {
		t.Fatalf("health %d %q", resp.StatusCode, b)
	}
	resp, _ = http.Get("http://" + s.Addr() + "/other")
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("/other: %d", resp.StatusCode)
	}
	http.DefaultClient.CloseIdleConnections()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := httpmeta.Serve(s.Addr() + "x"); err == nil {
		t.Fatal("bad listen address accepted")
	}
}

// The reference store master refuses to overwrite an rpc_meta key; the
// client accepts its own entry already being there.
func TestDuplicateRPCMetaRefused(t *testing.T) {
	st := httpmeta.NewStore(httpmeta.StoreOptions{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("key")
		if r.Method == "PUT" && strings.Contains(key, "rpc_meta") {
			if _, ok := st.Get(key); ok {
				w.WriteHeader(400)
				io.WriteString(w, "Duplicate rpc_meta key not allowed")
				return
			}
		}
		st.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	conn := srv.URL + "/metadata"
	ctx, cancel := context.WithTimeout(context.Background(), metatest.Wait)
	defer cancel()
	for i := range 2 { // two engines' lifetimes with the same name
		b, err := metadata.Open(conn, metadata.Options{RPCAddr: "127.0.0.1:15040"})
		if err != nil {
			t.Fatal(err)
		}
		for n := 1; n <= 2; n++ {
			if err := b.Publish(ctx, metatest.Desc("127.0.0.1:15040", n)); err != nil {
				t.Fatalf("life %d publish %d: %v", i, n, err)
			}
		}
		rpcKey := b.(*httpmeta.Backend).Keys().RPCMeta("127.0.0.1:15040")
		left, _ := st.Get(rpcKey)
		b.Close()
		if i == 0 {
			// As if it had crashed: its rpc_meta entry stays behind.
			st.Put(rpcKey, left)
		}
	}
	// Another address under the same name is a real conflict.
	st.Put("mooncake/rpc_meta/127.0.0.1:15041", []byte(`{"ip_or_host_name":"10.0.0.1","rpc_port":1}`))
	b, _ := metadata.Open(conn, metadata.Options{RPCAddr: "127.0.0.1:15041"})
	defer b.Close()
	if err := b.Publish(ctx, metatest.Desc("127.0.0.1:15041", 1)); err == nil || !strings.Contains(err.Error(), "Duplicate") {
		t.Fatalf("conflicting rpc_meta: %v", err)
	}
}

func TestBadConnStrings(t *testing.T) {
	for _, conn := range []string{
		"http://", "http:///metadata", "http://h:1/metadata?x=1", "http://h:1/metadata#f",
		"http://u:hunter2@h:port/metadata", "https://:1/metadata",
	} {
		_, err := metadata.Open(conn, metadata.Options{Timeout: time.Second})
		if !errors.Is(err, metadata.ErrBadConnString) {
			t.Fatalf("Open(%q): %v, want ErrBadConnString", conn, err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("error leaks the password: %v", err)
		}
	}
}

func TestNotAMetadataServer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(500)
		io.WriteString(w, "boom")
	}))
	defer srv.Close()
	_, err := metadata.Open(srv.URL+"/metadata", metadata.Options{Timeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "HTTP 500") {
		t.Fatalf("Open against a failing server: %v", err)
	}
}

func TestUnreachable(t *testing.T) {
	metatest.RunUnreachable(t, func(addr string) string { return "http://" + addr + "/metadata" })
}

// Operations against a server that went away fail with a clear error.
func TestServerGone(t *testing.T) {
	cfg, s := config(t)
	b := cfg.Open(t, metadata.Options{Timeout: time.Second, RPCAddr: "127.0.0.1:15042"})
	s.Close()
	ctx := context.Background()
	if _, err := b.Get(ctx, "127.0.0.1:15042"); !errors.Is(err, metadata.ErrUnavailable) {
		t.Fatalf("get: %v", err)
	}
	if err := b.Publish(ctx, metatest.Desc("127.0.0.1:15042", 1)); !errors.Is(err, metadata.ErrUnavailable) {
		t.Fatalf("publish: %v", err)
	}
}

// FuzzHandler drives the store with arbitrary requests: no panic, and a
// successful PUT is what a GET returns.
func FuzzHandler(f *testing.F) {
	f.Add("PUT", "mooncake/ram/a", []byte(`{"name":"a"}`))
	f.Add("GET", "", []byte(nil))
	f.Add("DELETE", "k%zz", []byte("x"))
	f.Add("PATCH", strings.Repeat("k", 5000), []byte("x"))
	st := httpmeta.NewStore(httpmeta.StoreOptions{MaxValueBytes: 1 << 10})
	f.Fuzz(func(t *testing.T, method, key string, body []byte) {
		target := "/metadata?key=" + url.QueryEscape(key)
		w := httptest.NewRecorder()
		req, err := http.NewRequest(method, target, bytes.NewReader(body))
		if err != nil {
			return
		}
		st.ServeHTTP(w, req)
		if method == "PUT" && w.Code == 200 {
			got, ok := st.Get(key)
			if !ok || !bytes.Equal(got, body) {
				t.Fatalf("PUT %q then store holds %q %v", key, got, ok)
			}
		}
		if w.Code >= 500 && w.Code != 507 {
			t.Fatalf("%s %q: %d", method, key, w.Code)
		}
	})
}

func BenchmarkBackend(b *testing.B) {
	s, err := httpmeta.Serve("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	metatest.BenchGet(b, metatest.Config{Conn: s.URL(), Raw: raw{s.Store()}})
}

// BenchmarkStoreGet is the server side alone: one GET through the
// handler, no network.
func BenchmarkStoreGet(b *testing.B) {
	st := httpmeta.NewStore(httpmeta.StoreOptions{})
	val, _ := metatest.Desc("127.0.0.1:15051", 8).Marshal()
	st.Put("mooncake/ram/127.0.0.1:15051", val)
	req := httptest.NewRequest("GET", "/metadata?key=mooncake%2Fram%2F127.0.0.1%3A15051", nil)
	b.SetBytes(int64(len(val)))
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		st.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatal(w.Code)
		}
	}
}
