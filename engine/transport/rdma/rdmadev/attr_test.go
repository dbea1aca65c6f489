package rdmadev

import (
	"errors"
	"testing"
)

func TestMTUEnum(t *testing.T) {
	for e := 1; e <= 5; e++ {
		m := MTUFromEnum(e)
		if !m.Valid() || m.Enum() != e {
			t.Errorf("enum %d -> %d -> %d", e, m, m.Enum())
		}
	}
	for _, e := range []int{-1, 0, 6, 100} {
		if m := MTUFromEnum(e); m != 0 {
			t.Errorf("enum %d -> %d, want 0", e, m)
		}
	}
	if MTU(1500).Enum() != 0 || MTU(1500).Valid() {
		t.Error("1500 is not a path MTU")
	}
}

func TestNegotiateMTU(t *testing.T) {
	for _, c := range []struct {
		in   []MTU
		want MTU
	}{
		{[]MTU{4096, 4096, 4096}, 4096},
		{[]MTU{4096, 1024, 4096}, 1024},
		{[]MTU{2048, 0, 4096}, 2048}, // peer did not say: ours and the cap
		{[]MTU{0, 0}, 0},
		{[]MTU{1500, 4096}, 1024}, // Ethernet-sized, rounded down
		{[]MTU{9000, 8192}, 4096},
		{[]MTU{200, 4096}, 0},
		{nil, 0},
	} {
		if got := NegotiateMTU(c.in...); got != c.want {
			t.Errorf("NegotiateMTU(%v) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestGIDText(t *testing.T) {
	g := GID{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x1b, 0x21, 0xff, 0xfe, 0x38, 0xa1, 0xb2}
	s := g.String()
	if s != "fe:80:00:00:00:00:00:00:02:1b:21:ff:fe:38:a1:b2" {
		t.Fatalf("String = %q", s)
	}
	back, err := ParseGID(s)
	if err != nil || back != g {
		t.Fatalf("ParseGID(%q) = %v, %v", s, back, err)
	}
	v6, err := ParseGID("fe80::21b:21ff:fe38:a1b2")
	if err != nil || v6 != g {
		t.Fatalf("IPv6 form: %v %v", v6, err)
	}
	m, err := ParseGID("::ffff:10.1.2.3")
	if err != nil || !m.IPv4Mapped() || g.IPv4Mapped() {
		t.Fatalf("mapped: %v %v", m, err)
	}
	for _, bad := range []string{"", "1:2:3", "zz:80:00:00:00:00:00:00:02:1b:21:ff:fe:38:a1:b2", "fe:80:00:00:00:00:00:00:02:1b:21:ff:fe:38:a1:b2:00", "10.0.0.1", "fe:80:00:00:00:00:00:00:02:1b:21:ff:fe:38:a1:1b2"} {
		if _, err := ParseGID(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseGID(%q) err = %v", bad, err)
		}
	}
}

func TestWCStatusString(t *testing.T) {
	if WCRemAccessErr.String() != "remote access error" || WCWRFlushErr.String() != "Work Request Flushed Error" {
		t.Fatal(WCRemAccessErr.String(), WCWRFlushErr.String())
	}
	if WCStatus(99).String() == "" {
		t.Fatal("empty")
	}
}

// FuzzParseGID checks the decoder never panics and that what it accepts
// formats back to an equal GID.
func FuzzParseGID(f *testing.F) {
	for _, s := range []string{"fe:80:00:00:00:00:00:00:02:1b:21:ff:fe:38:a1:b2", "::ffff:10.0.0.1", "fe80::1", "", "::", "1:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseGID(s)
		if err != nil {
			return
		}
		back, err := ParseGID(g.String())
		if err != nil || back != g {
			t.Fatalf("%q -> %v -> %v (%v)", s, g, back, err)
		}
	})
}
