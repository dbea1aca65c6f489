package main

import (
	"errors"
	"flag"
	"io"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"4096", 4096, true},
		{"4 GB", 4 << 30, true},
		{"4GB", 4 << 30, true},
		{"4gib", 4 << 30, true},
		{"1.5 MB", 3 << 19, true},
		{"512MiB", 512 << 20, true},
		{"16k", 16 << 10, true},
		{"2T", 2 << 40, true},
		{" 7 B ", 7, true},
		{"", 0, false},
		{"GB", 0, false},
		{"4 XB", 0, false},
		{"-1", 0, false},
		{"1e3", 0, false},
		{"9999999 TB", 0, false},
	}
	for _, tc := range cases {
		got, err := parseSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.master != "127.0.0.1:50051" || o.segment != 4<<30 || o.metricsPort != 9004 || o.metadata != "P2PHANDSHAKE" || o.heartbeat != time.Second {
		t.Fatalf("defaults: %+v", o)
	}
	o, err = parseFlags([]string{"--master_server_address", "10.0.0.1:1", "--global_segment_size", "64MB", "--local_buffer_size", "8MB",
		"--protocol", "tcp", "--metrics_port", "0", "--local_hostname", "127.0.0.1"}, io.Discard)
	if err != nil || o.master != "10.0.0.1:1" || o.segment != 64<<20 || o.buffer != 8<<20 || o.protocol != "tcp" || o.metricsPort != 0 || o.hostname != "127.0.0.1" {
		t.Fatalf("%+v %v", o, err)
	}
	for _, bad := range [][]string{
		{"--global_segment_size", "lots"},
		{"--local_buffer_size", "1 ZB"},
		{"--metrics_port", "70000"},
		{"--heartbeat_interval", "0s"},
		{"--no_such_flag"},
		{"extra"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// FuzzParseSize: any input gets a size or an error, never a panic; sizes
// are non-negative and plain digit strings read as bytes.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"0", "4 GB", "1.5MiB", "16k", "", "GB", "-1", "9999999 TB", "1e3", "..", " 7 b "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("parseSize(%q) = %d", s, n)
		}
	})
}
