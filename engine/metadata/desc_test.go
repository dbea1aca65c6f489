package metadata

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// goldenDesc is a Crescent TCP segment with the values a real engine
// publishes; the timestamp is fixed so the golden file is stable.
func goldenDesc() *SegmentDesc {
	ts := time.Date(2026, 7, 1, 12, 34, 56, 123456789, time.UTC)
	return &SegmentDesc{
		Name:            "10.0.0.5:15432",
		Protocol:        "tcp",
		TCPDataPort:     16011,
		TCPProtoVersion: 2,
		TCPDataHost:     "10.0.0.5",
		Timestamp:       Timestamp(ts),
		Buffers: []Buffer{
			{Name: "cpu:0", Addr: 0x7f5a_2000_0000, Length: 1 << 30},
			// Above 2^53: a JSON number that float64 decoders would round.
			{Name: "cpu:1", Addr: 0xffff_8000_0000_1000, Length: 4096},
		},
		Crescent: &Extension{Version: 1, HostID: "3f0c2d0e-5d1a-4b8e-9b1e-2f6a1c0d9e77", Protocols: []string{"shm", "tcp"},
			ShmSocket: "@crescent-shm-15432", ShmBuffers: []uint64{0x7f5a_2000_0000}},
	}
}

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs (go test -update rewrites it):\ngot  %s\nwant %s", name, got, want)
	}
}

func TestDescMarshalGolden(t *testing.T) {
	b, err := goldenDesc().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "desc_tcp.golden.json", b)
}

// TestDescMarshalSchema checks the encoding against the reference
// decoder's expectations, field by field, without relying on the golden
// file's exact bytes.
func TestDescMarshalSchema(t *testing.T) {
	b, err := goldenDesc().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(b, []byte("}\n")) || bytes.Count(b, []byte("\n")) != 1 {
		t.Fatalf("want compact JSON with one trailing newline: %q", b)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	wantStr := map[string]string{"name": "10.0.0.5:15432", "protocol": "tcp", "tcp_data_host": "10.0.0.5"}
	for k, v := range wantStr {
		if m[k] != v {
			t.Errorf("%s = %#v, want %q", k, m[k], v)
		}
	}
	wantNum := map[string]string{"tcp_data_port": "16011", "tcp_proto_version": "2"}
	for k, v := range wantNum {
		if n, ok := m[k].(json.Number); !ok || n.String() != v {
			t.Errorf("%s = %#v, want number %s", k, m[k], v)
		}
	}
	ts, _ := m["timestamp"].(string)
	if !regexp.MustCompile(`^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{6}$`).MatchString(ts) || ts != "2026-07-01 12:34:56.123456" {
		t.Errorf("timestamp = %q", ts)
	}
	bufs, ok := m["buffers"].([]any)
	if !ok || len(bufs) != 2 {
		t.Fatalf("buffers = %#v", m["buffers"])
	}
	wantBuf := []struct{ name, addr, length string }{
		{"cpu:0", "140025060655104", "1073741824"},
		{"cpu:1", "18446603336221200384", "4096"},
	}
	for i, w := range wantBuf {
		bm := bufs[i].(map[string]any)
		if bm["name"] != w.name {
			t.Errorf("buffer %d name = %#v", i, bm["name"])
		}
		// Numbers, never strings: the reference reads them with asUInt64.
		if n, ok := bm["addr"].(json.Number); !ok || n.String() != w.addr {
			t.Errorf("buffer %d addr = %#v, want number %s", i, bm["addr"], w.addr)
		}
		if n, ok := bm["length"].(json.Number); !ok || n.String() != w.length {
			t.Errorf("buffer %d length = %#v, want number %s", i, bm["length"], w.length)
		}
		for _, k := range []string{"rkey", "lkey", "offset"} {
			if _, ok := bm[k]; ok {
				t.Errorf("buffer %d of a tcp segment has %q", i, k)
			}
		}
	}
	// RDMA-only and CXL-only fields stay out of a TCP descriptor.
	for _, k := range []string{"devices", "priority_matrix", "cxl_name", "cxl_base_addr", "rdma_server_name"} {
		if _, ok := m[k]; ok {
			t.Errorf("tcp descriptor has %q", k)
		}
	}
}

func TestDescMarshalEmptyBuffers(t *testing.T) {
	// A segment with nothing registered yet: "buffers" must be an array
	// or absent, never something the reference cannot iterate.
	d := &SegmentDesc{Name: "h:1", Protocol: "tcp", TCPDataPort: 2, TCPProtoVersion: 2}
	b, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	json.Unmarshal(b, &m)
	if s := string(m["buffers"]); s != "null" && s != "[]" && s != "" {
		t.Fatalf("buffers = %s", s)
	}
	if _, err := UnmarshalDesc(b); err != nil {
		t.Fatalf("own empty descriptor rejected: %v", err)
	}
}

func TestTimestamp(t *testing.T) {
	cases := []struct {
		t    time.Time
		want string
	}{
		{time.Date(2026, 7, 1, 12, 34, 56, 123456789, time.UTC), "2026-07-01 12:34:56.123456"},
		// Microseconds are truncated (the reference prints tv_usec).
		{time.Date(2026, 1, 2, 3, 4, 5, 999999999, time.UTC), "2026-01-02 03:04:05.999999"},
		{time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC), "2026-12-31 23:59:59.000000"},
		// Local time of the time value, not UTC.
		{time.Date(2026, 3, 4, 5, 6, 7, 8000, time.FixedZone("X", 3600)), "2026-03-04 05:06:07.000008"},
	}
	for _, tc := range cases {
		if got := Timestamp(tc.t); got != tc.want {
			t.Errorf("Timestamp(%v) = %q, want %q", tc.t, got, tc.want)
		}
	}
}

// Descriptors as reference peers publish them (jsoncpp output: sorted
// keys, newline at the end), written from the reference's schema.
const (
	refTCPv2 = `{"buffers":[{"addr":140245219868672,"length":1073741824,"name":"10.0.0.7:15873"}],` +
		`"name":"10.0.0.7:15873","protocol":"tcp","tcp_data_port":16450,"tcp_proto_version":2,` +
		`"timestamp":"2026-07-01 12:34:56.123456"}` + "\n"
	// Older reference: no tcp_proto_version.
	refTCPv1 = `{"buffers":[{"addr":140245219868672,"length":65536,"name":"10.0.0.7:15873"}],` +
		`"name":"10.0.0.7:15873","protocol":"tcp","tcp_data_port":16450,"timestamp":"2026-07-01 12:34:56.123456"}` + "\n"
	refRDMA = `{"buffers":[{"addr":140245219868672,"length":1048576,"lkey":[513,514],"name":"cpu:0","rkey":[769,770]}],` +
		`"devices":[{"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:07","lid":0,"name":"mlx5_0"},` +
		`{"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:01:07","lid":0,"name":"mlx5_1"}],` +
		`"name":"10.0.0.7:15873","priority_matrix":{"cpu:0":[["mlx5_0"],["mlx5_1"]]},"protocol":"rdma",` +
		`"rdma_server_name":"10.0.0.7:15873","tcp_data_port":0,"timestamp":"2026-07-01 12:34:56.123456"}`
	// Multi-protocol builds: protocol is an array and buffers carry theirs.
	refMulti = `{"buffers":[{"addr":4096,"length":4096,"name":"cpu:0","protocol":"tcp"}],"name":"h:1",` +
		`"protocol":["tcp","rdma"],"tcp_data_port":16450,"tcp_proto_version":2}`
	refCXL = `{"buffers":[{"length":4096,"name":"cpu:0","offset":0}],"cxl_base_addr":0,"cxl_name":"dax0.0",` +
		`"name":"h:1","protocol":"cxl","tcp_data_port":0}`
)

func TestUnmarshalDesc(t *testing.T) {
	cases := []struct {
		name  string
		in    string
		check func(t *testing.T, d *SegmentDesc)
	}{
		{"reference tcp v2", refTCPv2, func(t *testing.T, d *SegmentDesc) {
			want := &SegmentDesc{Name: "10.0.0.7:15873", Protocol: "tcp", TCPDataPort: 16450, TCPProtoVersion: 2,
				Timestamp: "2026-07-01 12:34:56.123456",
				Buffers:   []Buffer{{Name: "10.0.0.7:15873", Addr: 140245219868672, Length: 1 << 30}}}
			if !reflect.DeepEqual(d, want) {
				t.Fatalf("got %+v\nwant %+v", d, want)
			}
		}},
		{"reference tcp without tcp_proto_version", refTCPv1, func(t *testing.T, d *SegmentDesc) {
			if d.TCPProtoVersion != 1 {
				t.Fatalf("tcp_proto_version = %d, want 1", d.TCPProtoVersion)
			}
		}},
		{"tcp_proto_version 0 means 1", `{"name":"h:1","protocol":"tcp","tcp_proto_version":0}`, func(t *testing.T, d *SegmentDesc) {
			if d.TCPProtoVersion != 1 {
				t.Fatalf("tcp_proto_version = %d, want 1", d.TCPProtoVersion)
			}
		}},
		{"reference rdma", refRDMA, func(t *testing.T, d *SegmentDesc) {
			if d.Protocol != "rdma" || len(d.Devices) != 2 || d.Devices[1].Name != "mlx5_1" ||
				!reflect.DeepEqual(d.Buffers[0].RKey, []uint64{769, 770}) || d.PriorityMatrix["cpu:0"][1][0] != "mlx5_1" ||
				d.RDMAServerName != "10.0.0.7:15873" {
				t.Fatalf("got %+v", d)
			}
		}},
		{"protocol array", refMulti, func(t *testing.T, d *SegmentDesc) {
			if d.Protocol != "tcp" || !d.HasProtocol("tcp") || d.Buffers[0].Addr != 4096 {
				t.Fatalf("got %+v", d)
			}
		}},
		{"cxl with zero offsets", refCXL, func(t *testing.T, d *SegmentDesc) {
			if d.Protocol != "cxl" || d.CXLName != "dax0.0" || d.Buffers[0].Length != 4096 {
				t.Fatalf("got %+v", d)
			}
		}},
		{"unknown fields ignored", `{"name":"h:1","protocol":"tcp","tcp_data_port":5,"metadata_version":3,` +
			`"future":{"a":[1,2,{"b":null}]},"buffers":[{"name":"x","addr":1,"length":2,"shm_name":"/s","device_id":-1}]}`,
			func(t *testing.T, d *SegmentDesc) {
				if d.Name != "h:1" || d.TCPDataPort != 5 || len(d.Buffers) != 1 || d.Buffers[0].Length != 2 {
					t.Fatalf("got %+v", d)
				}
			}},
		{"missing optional fields", `{"name":"h:1"}`, func(t *testing.T, d *SegmentDesc) {
			if d.Protocol != "" || d.TCPDataPort != 0 || d.Buffers != nil || d.TCPProtoVersion != 1 {
				t.Fatalf("got %+v", d)
			}
		}},
		{"null buffers", `{"name":"h:1","protocol":"tcp","buffers":null}`, func(t *testing.T, d *SegmentDesc) {
			if len(d.Buffers) != 0 {
				t.Fatalf("got %+v", d)
			}
		}},
		{"max uint64 length", `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":1,"length":18446744073709551614}]}`,
			func(t *testing.T, d *SegmentDesc) {
				if d.Buffers[0].Length != math.MaxUint64-1 {
					t.Fatalf("length = %d", d.Buffers[0].Length)
				}
			}},
		{"crescent extension", `{"name":"h:1","protocol":"tcp","crescent":{"version":1,"protocols":["shm","tcp"],"shm_buffers":[4096]}}`,
			func(t *testing.T, d *SegmentDesc) {
				if d.Crescent == nil || !d.HasProtocol("shm") || d.HasProtocol("rdma") {
					t.Fatalf("got %+v", d)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := UnmarshalDesc([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, d)
		})
	}
}

func TestUnmarshalDescErrors(t *testing.T) {
	cases := []struct{ name, in string }{
		{"empty", ``},
		{"not json", `{"name":`},
		{"null", `null`},
		{"array", `[]`},
		{"string", `"x"`},
		{"no name", `{"protocol":"tcp","buffers":[]}`},
		{"empty name", `{"name":"","protocol":"tcp"}`},
		{"addr as string", `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":"4096","length":1}]}`},
		{"length as string", `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":4096,"length":"1"}]}`},
		{"negative addr", `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":-1,"length":1}]}`},
		{"addr too large", `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":18446744073709551616,"length":1}]}`},
		{"fractional length", `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":1,"length":1.5}]}`},
		{"buffer without name", `{"name":"h:1","protocol":"tcp","buffers":[{"addr":4096,"length":1}]}`},
		{"buffer with zero addr", `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":0,"length":1}]}`},
		{"buffer with zero length", `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":4096,"length":0}]}`},
		{"buffer wraps", `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":18446744073709551615,"length":2}]}`},
		{"one bad buffer spoils all", `{"name":"h:1","protocol":"tcp","buffers":[{"name":"x","addr":4096,"length":1},{"name":"y","addr":0,"length":1}]}`},
		{"bad protocol array", `{"name":"h:1","protocol":["tcp",1]}`},
		{"protocol object", `{"name":"h:1","protocol":{"a":1}}`},
		{"tcp_data_port string", `{"name":"h:1","protocol":"tcp","tcp_data_port":"16000"}`},
		{"rkey/lkey mismatch", `{"name":"h:1","protocol":"rdma","buffers":[{"name":"x","addr":1,"length":1,"rkey":[1,2],"lkey":[1]}]}`},
		{"trailing garbage", `{"name":"h:1"} x`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := UnmarshalDesc([]byte(tc.in))
			if !errors.Is(err, ErrBadDescriptor) {
				t.Fatalf("UnmarshalDesc(%s) = %+v, %v; want ErrBadDescriptor", tc.in, d, err)
			}
			if d != nil {
				t.Fatalf("descriptor returned with error")
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ok := func() SegmentDesc {
		return SegmentDesc{Name: "h:1", Protocol: "tcp", Buffers: []Buffer{{Name: "cpu:0", Addr: 4096, Length: 4096}}}
	}
	cases := []struct {
		name   string
		mutate func(d *SegmentDesc)
		bad    bool
	}{
		{"valid", func(d *SegmentDesc) {}, false},
		{"no buffers", func(d *SegmentDesc) { d.Buffers = nil }, false},
		{"empty name", func(d *SegmentDesc) { d.Name = "" }, true},
		{"buffer empty name", func(d *SegmentDesc) { d.Buffers[0].Name = "" }, true},
		{"buffer zero addr", func(d *SegmentDesc) { d.Buffers[0].Addr = 0 }, true},
		{"cxl buffer zero addr", func(d *SegmentDesc) { d.Protocol = "cxl"; d.Buffers[0].Addr = 0 }, false},
		{"buffer zero length", func(d *SegmentDesc) { d.Buffers[0].Length = 0 }, true},
		{"cxl buffer zero length", func(d *SegmentDesc) { d.Protocol = "cxl"; d.Buffers[0].Length = 0 }, true},
		{"overflow", func(d *SegmentDesc) { d.Buffers[0].Addr = math.MaxUint64 - 10; d.Buffers[0].Length = 11 }, true},
		{"overflow by a lot", func(d *SegmentDesc) { d.Buffers[0].Addr = 1 << 63; d.Buffers[0].Length = 1 << 63 }, true},
		{"ends at the last byte", func(d *SegmentDesc) { d.Buffers[0].Addr = math.MaxUint64 - 10; d.Buffers[0].Length = 10 }, false},
		{"second buffer bad", func(d *SegmentDesc) { d.Buffers = append(d.Buffers, Buffer{Name: "x", Addr: 1}) }, true},
		{"rkeys only", func(d *SegmentDesc) {
			d.Devices = []Device{{Name: "a", GID: "fe80::1"}, {Name: "b", GID: "fe80::2"}}
			d.Buffers[0].RKey = []uint64{1, 2}
		}, false},
		{"rkey/lkey counts differ", func(d *SegmentDesc) { d.Buffers[0].RKey = []uint64{1, 2}; d.Buffers[0].LKey = []uint64{1} }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := ok()
			tc.mutate(&d)
			err := d.Validate()
			if tc.bad != (err != nil) {
				t.Fatalf("Validate = %v, want bad=%v", err, tc.bad)
			}
			if err != nil && !errors.Is(err, ErrBadDescriptor) {
				t.Fatalf("error %v is not ErrBadDescriptor", err)
			}
		})
	}
}

// TestDescRoundTrip: what Crescent marshals, Crescent decodes unchanged.
func TestDescRoundTrip(t *testing.T) {
	rdma := &SegmentDesc{Name: "h:1", Protocol: "rdma", TCPProtoVersion: 1,
		Devices:        []Device{{Name: "mlx5_0", LID: 7, GID: "fe80::1"}},
		Buffers:        []Buffer{{Name: "cpu:0", Addr: 1 << 40, Length: 1 << 20, RKey: []uint64{1 << 40}, LKey: []uint64{5}}},
		PriorityMatrix: map[string][2][]string{"cpu:0": {{"mlx5_0"}, {}}}}
	for _, d := range []*SegmentDesc{goldenDesc(), rdma} {
		b, err := d.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		got, err := UnmarshalDesc(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("round trip:\ngot  %+v\nwant %+v", got, d)
		}
	}
}

func FuzzUnmarshalDesc(f *testing.F) {
	for _, s := range []string{refTCPv2, refTCPv1, refRDMA, refMulti, refCXL, `{"name":"h:1"}`, `null`, `{}`,
		`{"name":"h:1","protocol":[],"buffers":[{"name":"x","addr":1,"length":1}]}`,
		// first_device+devices overflowed efa's bounds check.
		`{"name":"h:1","protocol":"tcp","devices":[{"name":"d","gid":"00"}],"crescent":{"version":1,"efa":{"provider":"efa","first_device":9223372036854775807,"devices":1}}}`} {
		f.Add([]byte(s))
	}
	if b, err := goldenDesc().Marshal(); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		d, err := UnmarshalDesc(in)
		if err != nil {
			if d != nil || !errors.Is(err, ErrBadDescriptor) {
				t.Fatalf("bad error: %v (desc %v)", err, d != nil)
			}
			return
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("accepted descriptor fails Validate: %v", err)
		}
		if d.TCPProtoVersion == 0 {
			t.Fatalf("tcp_proto_version left at 0")
		}
		// What we accept, we re-encode and accept again unchanged.
		b1, err := d.Marshal()
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		d2, err := UnmarshalDesc(b1)
		if err != nil {
			t.Fatalf("re-decode of %s: %v", b1, err)
		}
		b2, _ := d2.Marshal()
		if !bytes.Equal(b1, b2) {
			t.Fatalf("not a fixed point:\n%s\n%s", b1, b2)
		}
		if strings.Count(string(b1), "\n") != 1 {
			t.Fatalf("marshal output not one line: %q", b1)
		}
	})
}
