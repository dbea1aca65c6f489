package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/storepb"
)

// statusMaster is a master with two clients, three segments and some
// keys, served over gRPC (so the RPC counters move) and on an admin
// HTTP server.
func statusMaster(t *testing.T) (*mastertest.Env, *httptest.Server) {
	t.Helper()
	e := mastertest.New(t, nil)
	a, b := mastertest.Client(1), mastertest.Client(2)
	e.Mount(a, "host-a:1", 4<<20)
	e.Mount(a, "host-a:2", 2<<20)
	e.Mount(b, "host-b:1", 8<<20)
	for i := range 5 {
		e.Put(a, fmt.Sprintf("k%d", i), 300<<10, master.ReplicateConfig{})
	}
	e.Put(b, "pinned", 1<<20, master.ReplicateConfig{HardPin: true})
	cli, svc := serve(t, e.M)
	// Two puts over the RPCs, so the page's put count moves too.
	for _, k := range []string{"rpc-0", "rpc-1"} {
		ps, err := cli.PutStart(context.Background(), &storepb.PutStartRequest{ClientId: pbID(b), Key: k, Size: 64 << 10,
			Config: &storepb.ReplicateConfig{ReplicaNum: 1}})
		require.NoError(t, err)
		_, err = cli.PutEnd(context.Background(), &storepb.PutEndRequest{ClientId: pbID(b), Key: k, Generation: ps.Generation})
		require.NoError(t, err)
	}
	for _, k := range []string{"k0", "k1", "k2"} {
		_, err := cli.GetReplicaList(context.Background(), &storepb.GetReplicaListRequest{Key: k})
		require.NoError(t, err)
	}
	srv := httptest.NewServer(Handler(e.M, svc, prometheus.NewRegistry(), nil))
	t.Cleanup(srv.Close)
	return e, srv
}

func TestStatusJSON(t *testing.T) {
	e, srv := statusMaster(t)
	resp, err := http.Get(srv.URL + "/status.json")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var st Status
	require.NoError(t, json.Unmarshal(body, &st))
	s := e.M.Stats()
	assert.Equal(t, Single, st.Role)
	assert.True(t, st.Serving)
	assert.Equal(t, s.Keys, st.Keys)
	assert.Equal(t, int64(8), st.Keys)
	assert.Equal(t, s.Segments, st.SegmentCount)
	assert.Equal(t, 3, st.SegmentCount)
	assert.Equal(t, 2, st.ClientCount)
	assert.Equal(t, s.Capacity, st.Capacity)
	assert.Equal(t, s.Allocated, st.Allocated)
	assert.Equal(t, uint64(3), st.Gets)
	assert.Equal(t, uint64(2), st.Puts)
	require.Len(t, st.Segments, 3)
	assert.Equal(t, "host-a:1", st.Segments[0].Name)
	assert.Equal(t, []StatusClient{
		{Number: 1, Segments: 2, Capacity: 6 << 20, Used: st.Segments[0].Used + st.Segments[1].Used},
		{Number: 2, Segments: 1, Capacity: 8 << 20, Used: st.Segments[2].Used},
	}, st.Clients)
	// No client id or anything credential-like on an open page.
	for _, id := range []master.UUID{mastertest.Client(1), mastertest.Client(2)} {
		assert.NotContains(t, string(body), uuidString(id))
	}
	for _, word := range []string{"token", "credential", "secret", "password"} {
		assert.NotContains(t, strings.ToLower(string(body)), word)
	}

	resp, err = http.Get(srv.URL + "/")
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'")
	// Self-contained: nothing loaded from elsewhere.
	assert.NotRegexp(t, `(?i)(src|href)\s*=\s*["']?(https?:)?//`, string(page))

	resp, err = http.Post(srv.URL+"/", "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

func TestStatusRole(t *testing.T) {
	e := mastertest.New(t, nil)
	h := Handler(e.M, nil, prometheus.NewRegistry(), nil, WithRole(func() Role { return Role{Role: "leader", Term: 7, Leader: "10.0.0.1:50051"} }))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/status.json", nil))
	var st Status
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &st))
	assert.Equal(t, Role{Role: "leader", Term: 7, Leader: "10.0.0.1:50051"}, st.Role)

	w = httptest.NewRecorder()
	NotServingStatus(w, Role{Role: "standby", Term: 7})
	st = Status{}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &st))
	assert.Equal(t, Status{Role: Role{Role: "standby", Term: 7}, Segments: []StatusSegment{}, Clients: []StatusClient{}}, st)
}

// chromium finds the headless browser, or skips (fails under
// CRESCENT_REQUIRE_DEPS=1, as make test runs).
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "no chromium on PATH: install Debian's chromium package (make deps does) to test the status page in a browser"
	if os.Getenv("CRESCENT_REQUIRE_DEPS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// runChromium runs headless chromium on url with args, in a fresh
// profile, and returns its stdout.
func runChromium(t *testing.T, bin, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
		"--disable-crash-reporter", "--disable-breakpad", "--user-data-dir=" + t.TempDir(),
		// Lets the page's first fetch and render finish before the dump.
		"--virtual-time-budget=5000"}, args...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	cmd.WaitDelay = 5 * time.Second
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), "chromium: %s", errb.String())
	return out.String()
}

// dataValue reads data-value of the element with id in a dumped DOM.
func dataValue(t *testing.T, dom, id string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`<[a-z]+ [^>]*id="` + regexp.QuoteMeta(id) + `"[^>]*data-value="(\d+)"`).FindStringSubmatch(dom)
	require.NotNil(t, m, "element #%s with data-value not in the page:\n%s", id, dom)
	v, err := strconv.ParseUint(m[1], 10, 64)
	require.NoError(t, err)
	return v
}

// TestStatusPageChromium loads the status page in headless Chromium and
// checks what the browser rendered against the master's own counters.
func TestStatusPageChromium(t *testing.T) {
	bin := chromium(t)
	e, srv := statusMaster(t)
	s := e.M.Stats()
	segs := e.M.AllSegments()

	var dom string
	// A loaded machine may dump before the first fetch is rendered; the
	// page marks the body data-state="ready" once it has.
	for range 3 {
		dom = runChromium(t, bin, srv.URL+"/", "--dump-dom")
		if strings.Contains(dom, `data-state="ready"`) {
			break
		}
	}
	require.Contains(t, dom, `data-state="ready"`, "the page never rendered status.json:\n%s", dom)

	assert.Equal(t, uint64(s.Keys), dataValue(t, dom, "keys"))
	assert.Equal(t, uint64(s.Segments), dataValue(t, dom, "segment-count"))
	assert.Equal(t, uint64(s.ActiveClients), dataValue(t, dom, "client-count"))
	assert.Equal(t, s.Allocated, dataValue(t, dom, "allocated"))
	assert.Equal(t, s.Capacity, dataValue(t, dom, "capacity"))
	assert.Equal(t, uint64(3), dataValue(t, dom, "gets"))
	assert.Equal(t, uint64(2), dataValue(t, dom, "puts"))
	assert.Equal(t, s.EvictedKeys, dataValue(t, dom, "evicted-keys"))
	assert.Contains(t, dom, `id="role" class="badge single">single<`)
	pct := 100 * float64(s.Allocated) / float64(s.Capacity)
	assert.Contains(t, dom, fmt.Sprintf(`id="usage">%.1f%%<`, pct))

	rows := regexp.MustCompile(`<tr class="segment" data-name="([^"]+)" data-used="(\d+)" data-capacity="(\d+)">`).FindAllStringSubmatch(dom, -1)
	require.Len(t, rows, len(segs))
	want := map[string][2]uint64{}
	for _, g := range segs {
		want[g.Name] = [2]uint64{g.Used, g.Capacity}
	}
	for _, r := range rows {
		used, _ := strconv.ParseUint(r[2], 10, 64)
		capacity, _ := strconv.ParseUint(r[3], 10, 64)
		assert.Equal(t, want[r[1]], [2]uint64{used, capacity}, "segment %s", r[1])
		assert.Contains(t, dom, fmt.Sprintf(`width: %.1f%%;`, 100*float64(used)/float64(capacity)))
	}

	if path := os.Getenv("CRESCENT_STATUS_SCREENSHOT"); path != "" {
		// CRESCENT_STATUS_SCREENSHOT=$PWD/docs/status.png refreshes the README's picture.
		runChromium(t, bin, srv.URL+"/", "--hide-scrollbars", "--window-size=1000,500", "--screenshot="+path)
	}
}
