package efa

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

func TestHandshakeEncoding(t *testing.T) {
	m := handshakeMsg{Protocol: Protocol, LocalNicPath: "10.0.0.1:15000@rdmap0", PeerNicPath: "10.0.0.2:15001@rdmap1", EFAAddr: "0a0bff"}
	got := string(m.encode())
	want := `{"protocol":"efa","payload":"","local_nic_path":"10.0.0.1:15000@rdmap0","local_lid":0,"local_gid":"","peer_nic_path":"10.0.0.2:15001@rdmap1","qp_num":[],"reply_msg":"","efa_addr":"0a0bff"}`
	if got != want {
		t.Fatalf("encode:\n got %s\nwant %s", got, want)
	}
	d, err := decodeHandshake([]byte(want))
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.addr()
	if err != nil || !bytes.Equal(a, []byte{0x0a, 0x0b, 0xff}) {
		t.Fatalf("addr %x %v", a, err)
	}
}

func TestHandshakeDecodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		addrErr  bool
	}{
		{"not json", `{`, false},
		{"array", `[]`, false},
		{"qp_num string", `{"qp_num":"1"}`, false},
		{"lid negative", `{"local_lid":-1}`, false},
		{"protocol number", `{"protocol":1}`, false},
		{"no addr", `{"protocol":"efa"}`, true},
		{"odd hex", `{"efa_addr":"abc"}`, true},
		{"not hex", `{"efa_addr":"zz"}`, true},
		{"too long", `{"efa_addr":"` + string(bytes.Repeat([]byte("00"), maxAddrLen+1)) + `"}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := decodeHandshake([]byte(tc.in))
			if !tc.addrErr {
				if !errors.Is(err, ErrBadHandshake) {
					t.Fatalf("decode: %v, want ErrBadHandshake", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.addr(); !errors.Is(err, ErrBadHandshake) {
				t.Fatalf("addr: %v, want ErrBadHandshake", err)
			}
		})
	}
}

func TestSplitNicPath(t *testing.T) {
	for _, tc := range []struct {
		in, server, nic string
		ok              bool
	}{
		{"127.0.0.1:15000@lo", "127.0.0.1:15000", "lo", true},
		{"[::1]:1@a@b", "[::1]:1@a", "b", true},
		{"@lo", "", "", false},
		{"host@", "", "", false},
		{"nohost", "", "", false},
	} {
		s, n, ok := splitNicPath(tc.in)
		if s != tc.server || n != tc.nic || ok != tc.ok {
			t.Errorf("splitNicPath(%q) = %q, %q, %v", tc.in, s, n, ok)
		}
	}
}

// FuzzDecodeHandshake: any input decodes or fails cleanly; what decodes
// re-encodes to an equivalent message, and addr never panics.
func FuzzDecodeHandshake(f *testing.F) {
	for _, s := range []string{
		`{"protocol":"efa","payload":"","local_nic_path":"a:1@lo","local_lid":0,"local_gid":"","peer_nic_path":"b:2@lo","qp_num":[],"reply_msg":"","efa_addr":"0200a1b27f000001"}`,
		`{"protocol":"efa","reply_msg":"EFA nic path inconsistency"}`,
		`{"qp_num":[1,2,3],"local_lid":65535}`,
		`{}`, `null`, `[]`, `{"efa_addr":"ZZ"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeHandshake(b)
		if err != nil {
			return
		}
		m.addr()
		again, err := decodeHandshake(m.encode())
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		x, _ := json.Marshal(m)
		y, _ := json.Marshal(again)
		if !bytes.Equal(x, y) {
			t.Fatalf("round trip changed the message:\n%s\n%s", x, y)
		}
	})
}
