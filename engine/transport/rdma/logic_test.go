package rdma

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestResolveMatrix(t *testing.T) {
	names := []string{"mlx5_0", "mlx5_1", "mlx5_2"}
	m, err := resolveMatrix(names, map[string][2][]string{
		"cpu:0": {{"mlx5_0"}, {"mlx5_1"}},
		"cpu:1": {{"mlx5_1", "mlx5_2"}, {}},
		"*":     {{"mlx5_2"}, {"mlx5_0"}},
	}, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		loc  string
		want string
	}{
		{"cpu:0", "{[0] [1 2]}"}, // missing NICs become "avail"
		{"cpu:1", "{[1 2] [0]}"},
		{"cpu:7", "{[2] [0 1]}"}, // unknown location: the "*" entry
	} {
		if got := fmt.Sprint(m.lookup(c.loc)); got != c.want {
			t.Errorf("%s: %s, want %s", c.loc, got, c.want)
		}
	}
	if _, err := resolveMatrix(names, map[string][2][]string{"cpu:0": {{"mlx5_9"}, {}}}, true); !errors.Is(err, ErrConfig) {
		t.Fatalf("unknown NIC: %v", err)
	}
	// A peer's matrix may name NICs we do not see: skipped.
	m, err = resolveMatrix(names[:1], map[string][2][]string{"cpu:0": {{"mlx5_9", "mlx5_0"}, {}}}, false)
	if err != nil || fmt.Sprint(m.lookup("cpu:0")) != "{[0] []}" {
		t.Fatalf("%v %v", m.lookup("cpu:0"), err)
	}
	// No matrix: every NIC preferred.
	m, _ = resolveMatrix(names, nil, false)
	if fmt.Sprint(m.lookup("cpu:0")) != "{[0 1 2] []}" {
		t.Fatal(m.lookup("cpu:0"))
	}
}

func TestNUMAMatrix(t *testing.T) {
	pm := numaMatrix([]string{"a", "b", "c"}, []int{0, 1, -1})
	if fmt.Sprint(pm["cpu:0"]) != "[[a] [b c]]" || fmt.Sprint(pm["cpu:1"]) != "[[b] [a c]]" || fmt.Sprint(pm["*"]) != "[[a b c] []]" || len(pm) != 3 {
		t.Fatalf("%v", pm)
	}
}

func TestChoosePath(t *testing.T) {
	L := prefs{preferred: []int{0, 1}, avail: []int{2}}
	R := prefs{preferred: []int{0, 1}}
	all := func(int, int) bool { return true }
	// First attempts spread over preferred NICs.
	seen := map[[2]int]int{}
	for ctr := range uint64(8) {
		l, r, ok := choosePath(L, R, ctr, 0, -1, -1, all)
		if !ok || l > 1 {
			t.Fatalf("ctr %d: %d %d %v", ctr, l, r, ok)
		}
		seen[[2]int{l, r}]++
	}
	if len(seen) < 2 {
		t.Fatalf("no spreading: %v", seen)
	}
	// A retry avoids the pair that failed.
	for retry := 1; retry < 10; retry++ {
		for ctr := range uint64(5) {
			l, r, ok := choosePath(L, R, ctr, retry, 0, 0, all)
			if !ok || l == 0 && r == 0 {
				t.Fatalf("retry %d ctr %d: %d %d %v", retry, ctr, l, r, ok)
			}
		}
	}
	// Unusable pairs are skipped; the failed pair is the last resort.
	only00 := func(l, r int) bool { return l == 0 && r == 0 }
	if l, r, ok := choosePath(L, R, 3, 2, 0, 0, only00); !ok || l != 0 || r != 0 {
		t.Fatalf("last resort: %d %d %v", l, r, ok)
	}
	if _, _, ok := choosePath(L, R, 3, 0, -1, -1, func(int, int) bool { return false }); ok {
		t.Fatal("chose an unusable pair")
	}
	// Preferred local NICs down: fall back to the avail one.
	l, _, ok := choosePath(L, R, 0, 0, -1, -1, func(l, r int) bool { return l == 2 })
	if !ok || l != 2 {
		t.Fatalf("fallback: %d %v", l, ok)
	}
}

func TestHealth(t *testing.T) {
	cfg := Config{PauseErrors: 3, PauseWindow: time.Second, PauseFor: 10 * time.Second}
	h := newHealth(&cfg)
	k := pairKey{0, "peer@nic"}
	t0 := time.Unix(1000, 0)
	if h.record(k, t0) || h.record(k, t0.Add(2*time.Second)) || h.record(k, t0.Add(2500*time.Millisecond)) {
		t.Fatal("paused with errors spread beyond the window")
	}
	if !h.record(k, t0.Add(2900*time.Millisecond)) {
		t.Fatal("3 errors within 1s did not pause")
	}
	if !h.isPaused(k, t0.Add(5*time.Second)) || h.isPaused(pairKey{1, "peer@nic"}, t0.Add(5*time.Second)) {
		t.Fatal("pause state")
	}
	if h.record(k, t0.Add(6*time.Second)) {
		t.Fatal("errors while paused count again")
	}
	if h.pausedNow(t0.Add(5*time.Second)) != 1 {
		t.Fatal("pausedNow")
	}
	if h.isPaused(k, t0.Add(13*time.Second)) {
		t.Fatal("pause did not end")
	}
	if h.pauses.Load() != 1 || h.paused.Load() != 0 {
		t.Fatalf("counters %d %d", h.pauses.Load(), h.paused.Load())
	}
	off := newHealth(&Config{})
	for range 100 {
		if off.record(k, t0) {
			t.Fatal("PauseErrors 0 pauses")
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	var c Config
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.SliceSize != 64<<10 || c.QPsPerEndpoint != 2 || c.MaxEndpoints != 256 || c.MaxWR != 256 || c.MaxSGE != 4 ||
		c.CQDepth != 4096 || c.PollBatch != 64 || c.MaxMTU != 4096 || c.Timeout != 14 || c.RetryCount != 7 || c.RNRRetry != 7 ||
		c.MaxRetries != 9 || c.PauseErrors != 5 || c.PauseWindow != 5*time.Second {
		t.Fatalf("%+v", c)
	}
	for _, bad := range []Config{{QPsPerEndpoint: 65}, {MaxWR: 512, CQDepth: 256}, {MaxMTU: 1500}, {GIDIndex: -1}, {SliceSize: -1}} {
		if err := bad.setDefaults(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	c = Config{MaxRetries: -1}
	c.setDefaults()
	if c.MaxRetries != 0 {
		t.Fatal("MaxRetries -1")
	}
}

func TestNICPath(t *testing.T) {
	for _, c := range []struct {
		in, server, dev string
		ok              bool
	}{
		{"10.0.0.1:15001@mlx5_0", "10.0.0.1:15001", "mlx5_0", true},
		{"a@b@mlx5_1", "a@b", "mlx5_1", true},
		{"nodevice", "", "", false},
		{"@mlx5_0", "", "", false},
		{"host@", "", "", false},
	} {
		s, d, ok := splitNICPath(c.in)
		if s != c.server || d != c.dev || ok != c.ok {
			t.Errorf("%q: %q %q %v", c.in, s, d, ok)
		}
	}
	if nicPath("h:1", "d") != "h:1@d" {
		t.Fatal("nicPath")
	}
}

func TestHandshakeCodec(t *testing.T) {
	m := &hsMsg{Protocol: "rdma", LocalNICPath: "a:1@x", PeerNICPath: "b:2@y", QPNum: []uint32{5, 6}, LocalLID: 3,
		LocalGID: "fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01", MTU: 4096}
	b := m.encode()
	if b[len(b)-1] != '\n' {
		t.Fatal("no trailing newline")
	}
	for _, k := range []string{`"protocol":"rdma"`, `"local_nic_path":"a:1@x"`, `"peer_nic_path":"b:2@y"`, `"qp_num":[5,6]`, `"local_lid":3`, `"reply_msg":""`, `"crescent_mtu":4096`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("%s lacks %s", b, k)
		}
	}
	back, err := decodeHandshake(b)
	if err != nil || fmt.Sprint(*back) != fmt.Sprint(*m) {
		t.Fatalf("%+v %v", back, err)
	}
	// A reference peer's reply: no crescent_mtu, extra fields.
	ref := `{"local_gid":"","local_lid":0,"local_nic_path":"b:2@y","payload":"","peer_nic_path":"a:1@x","protocol":"rdma","qp_num":[7,8],"reply_msg":""}`
	if r, err := decodeHandshake([]byte(ref)); err != nil || r.MTU != 0 || len(r.QPNum) != 2 {
		t.Fatalf("%+v %v", r, err)
	}
	for _, bad := range []string{"", "null", "[]", `{"qp_num":"x"}`, `{"qp_num":[-1]}`, `{"qp_num":[4294967296]}`, `{"local_lid":-1}`, `{"reply_msg":5}`, `{"crescent_mtu":-5}`, "{"} {
		if _, err := decodeHandshake([]byte(bad)); !errors.Is(err, ErrHandshake) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// FuzzDecodeHandshake: the decoder never panics, and what it accepts
// encodes and decodes to the same message.
func FuzzDecodeHandshake(f *testing.F) {
	for _, s := range []string{
		`{"protocol":"rdma","local_nic_path":"10.0.0.1:15001@mlx5_0","peer_nic_path":"10.0.0.2:15002@mlx5_1","qp_num":[291,292],"local_lid":0,"local_gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01","reply_msg":""}`,
		`{"local_nic_path":"","peer_nic_path":"","qp_num":[],"reply_msg":"Unsupported handshake protocol: rdma"}`,
		`{"status":"error","reply_msg":"nope"}`,
		`{"qp_num":[1],"crescent_mtu":1024}`,
		`null`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeHandshake(b)
		if err != nil {
			return
		}
		back, err := decodeHandshake(m.encode())
		if err != nil || fmt.Sprint(*back) != fmt.Sprint(*m) {
			t.Fatalf("%q: %+v -> %+v (%v)", b, m, back, err)
		}
	})
}
