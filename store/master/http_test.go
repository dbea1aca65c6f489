package master

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestAdminHandler(t *testing.T) {
	e := newEnv(t, nil)
	a := cl(1)
	e.mount(a, "seg-a:1", 1<<20)
	e.put(a, "k1", 1000, ReplicateConfig{})
	e.put(a, "k2", 2000, ReplicateConfig{HardPin: true})
	if _, _, err := e.m.GetReplicaList("k1"); err != nil {
		t.Fatal(err)
	}
	e.reserve(a, 4096, ReplicateConfig{}, 2)
	var metrics *Metrics
	svc := NewService(e.m, WithObserver(func(rpc string, d time.Duration, err error) { metrics.Observe(rpc, d, err) }))
	metrics = NewMetrics(e.m, svc)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	extra := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "extra "+r.URL.Path) })
	srv := httptest.NewServer(AdminHandler(e.m, svc, reg, extra))
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
