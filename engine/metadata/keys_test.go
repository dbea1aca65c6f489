package metadata

import (
	"errors"
	"net"
	"strings"
	"testing"
)

func TestKeys(t *testing.T) {
	for _, tc := range []struct {
		cluster, name, seg, rpc string
	}{
		{"", "10.0.0.1:15001", "mooncake/ram/10.0.0.1:15001", "mooncake/rpc_meta/10.0.0.1:15001"},
		{"c1", "node-a", "mooncake/c1/ram/node-a", "mooncake/c1/rpc_meta/node-a"},
		{"c1/", "node-a", "mooncake/c1/ram/node-a", "mooncake/c1/rpc_meta/node-a"},
		{"", "pool/seg", "mooncake/pool/seg", "mooncake/rpc_meta/pool/seg"},
		{"x", "[::1]:15001", "mooncake/x/ram/[::1]:15001", "mooncake/x/rpc_meta/[::1]:15001"},
	} {
		k := NewKeys(tc.cluster)
		if got := k.Segment(tc.name); got != tc.seg {
			t.Errorf("Segment(%q) with cluster %q = %q, want %q", tc.name, tc.cluster, got, tc.seg)
		}
		if got := k.RPCMeta(tc.name); got != tc.rpc {
			t.Errorf("RPCMeta(%q) with cluster %q = %q, want %q", tc.name, tc.cluster, got, tc.rpc)
		}
	}
}

func TestRPCMetaCodec(t *testing.T) {
	for addr, want := range map[string]string{
		"10.0.0.1:15123":  `{"ip_or_host_name":"10.0.0.1","rpc_port":15123}` + "\n",
		"node-a:1":        `{"ip_or_host_name":"node-a","rpc_port":1}` + "\n",
		"[fe80::1]:15000": `{"ip_or_host_name":"fe80::1","rpc_port":15000}` + "\n",
	} {
		b, err := EncodeRPCMeta(addr)
		if err != nil || string(b) != want {
			t.Fatalf("EncodeRPCMeta(%q) = %q %v, want %q", addr, b, err, want)
		}
		back, err := DecodeRPCMeta(b)
		if err != nil || back != addr {
			t.Fatalf("DecodeRPCMeta(%q) = %q %v", b, back, err)
		}
	}
	for _, bad := range []string{"", "host", "host:0", "host:65536", ":15000", "host:x"} {
		if _, err := EncodeRPCMeta(bad); err == nil {
			t.Errorf("EncodeRPCMeta(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"", "null", "{}", "[]", `{"ip_or_host_name":"h","rpc_port":0}`, `{"ip_or_host_name":"h","rpc_port":-1}`, `{"ip_or_host_name":1,"rpc_port":1}`} {
		if _, err := DecodeRPCMeta([]byte(bad)); !errors.Is(err, ErrBadReply) {
			t.Errorf("DecodeRPCMeta(%q) = %v, want ErrBadReply", bad, err)
		}
	}
}

func FuzzDecodeRPCMeta(f *testing.F) {
	f.Add([]byte(`{"ip_or_host_name":"10.0.0.1","rpc_port":15123}` + "\n"))
	f.Add([]byte(`{"ip_or_host_name":"::1","rpc_port":1}`))
	f.Add([]byte(`{"rpc_port":99999}`))
	f.Add([]byte(`nul`))
	f.Fuzz(func(t *testing.T, b []byte) {
		addr, err := DecodeRPCMeta(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same address.
		enc, err := EncodeRPCMeta(addr)
		if err != nil {
			t.Fatalf("decoded %q from %q but cannot encode it: %v", addr, b, err)
		}
		if again, err := DecodeRPCMeta(enc); err != nil || again != addr {
			t.Fatalf("round trip %q -> %q -> %q %v", b, addr, again, err)
		}
	})
}

func TestFillDataHost(t *testing.T) {
	lookup := func() (string, error) { return "10.9.8.7:15000", nil }
	for _, tc := range []struct{ name, have, want string }{
		{"node-a", "", "10.9.8.7"},       // host-only name: from rpc_meta
		{"node-a", "1.1.1.1", "1.1.1.1"}, // already set
		{"10.0.0.1:15001", "", ""},       // host:port: the transport uses the name
		{"[fe80::1]:15001", "", ""},      // likewise
		{"pool/seg", "", "10.9.8.7"},     // slash names are host-less too
		{"node-b", "", "10.9.8.7"},
	} {
		d := &SegmentDesc{Name: tc.name, TCPDataHost: tc.have}
		FillDataHost(d, lookup)
		if d.TCPDataHost != tc.want {
			t.Errorf("%q (had %q): %q, want %q", tc.name, tc.have, d.TCPDataHost, tc.want)
		}
	}
	d := &SegmentDesc{Name: "node-c"}
	FillDataHost(d, func() (string, error) { return "", ErrNotFound })
	if d.TCPDataHost != "" {
		t.Fatalf("lookup failure set %q", d.TCPDataHost)
	}
}

func TestOpenDefaultsAndBareEndpoint(t *testing.T) {
	// Without the etcd backend linked (this package alone), a bare
	// host:port is etcd and unknown, and the error says so.
	_, err := Open("127.0.0.1:2379", Options{})
	if !errors.Is(err, ErrUnknownServer) || !strings.Contains(err.Error(), "etcd") {
		t.Fatalf("bare endpoint: %v", err)
	}
	var got Options
	Register("crescent-defaults", func(conn string, opts Options) (Backend, error) {
		got = opts
		return nil, ErrUnknownServer
	})
	t.Setenv(ClusterIDEnv, "from-env")
	Open("crescent-defaults://x", Options{})
	if got.Timeout <= 0 || got.TTL != DefaultTTL || got.PollInterval <= 0 || got.Logger == nil || got.ClusterID != "from-env" {
		t.Fatalf("defaults not applied: %+v", got)
	}
	Open("crescent-defaults://x", Options{ClusterID: "explicit"})
	if got.ClusterID != "explicit" {
		t.Fatalf("explicit cluster id replaced: %q", got.ClusterID)
	}
}

func TestDialDiagnosis(t *testing.T) {
	s := startServer(t, ServerConfig{})
	if got := DialDiagnosis(s.Addr()); !strings.Contains(got, "accepts TCP") {
		t.Fatalf("listening address: %q", got)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if got := DialDiagnosis(closed); !strings.Contains(got, "refused") {
		t.Fatalf("closed port: %q", got)
	}
}
