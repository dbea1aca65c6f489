package main

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"65536": 65536, "64KiB": 64 << 10, "1MiB": 1 << 20, "1GiB": 1 << 30, "512M": 512 << 20, "2G": 2 << 30, "1MB": 1e6, " 4K ": 4096} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1", "1TiB", "MiB", "1.5G"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) accepted", bad)
		}
	}
}
