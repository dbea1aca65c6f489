package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		{"-4 GB", 0, false},
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
		"--protocol", "tcp", "--metrics_port", "0", "--local_hostname", "127.0.0.1", "--put_ahead_bytes", "256MiB",
		"--location_cache", "65536"}, io.Discard)
	if err != nil || o.locationCache != 65536 || o.master != "10.0.0.1:1" || o.segment != 64<<20 || o.buffer != 8<<20 || o.aheadBytes != 256<<20 || o.protocol != "tcp" || o.metricsPort != 0 || o.hostname != "127.0.0.1" {
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

// Every refused command line is a usage error (exit 2) in one line
// naming the flag, before anything is allocated or dialled.
func TestRefusedFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--global_segment_size", "-1"}, `--global_segment_size: size "-1": must not be negative`},
		{[]string{"--local_buffer_size", "-64 MB"}, `--local_buffer_size: size "-64 MB": must not be negative`},
		{[]string{"--put_ahead_bytes", "-1"}, `--put_ahead_bytes: size "-1": must not be negative`},
		{[]string{"--location_cache", "-1"}, "--location_cache -1: want 0 (off) or a count"},
		{[]string{"--global_segment_size", "lots"}, `--global_segment_size: size "lots": not a number`},
		{[]string{"--log_level", "loud"}, `--log_level "loud"`},
		{[]string{"--log_format", "xml"}, `--log_format "xml": want text or json`},
		{[]string{"--master_protocol", "smoke"}, `--master_protocol "smoke"`},
		{[]string{"--master_server_address", "nohost"}, `--master_server_address "nohost": want host:port`},
		{[]string{"--metrics_port", "-1"}, "--metrics_port -1"},
		{[]string{"--heartbeat_interval", "0s"}, "--heartbeat_interval 0s"},
		{[]string{"--heartbeat_interval", "soon"}, "-heartbeat_interval"},
		{[]string{"--no_such_flag"}, "flag provided but not defined: -no_such_flag"},
		{[]string{"stray"}, `unexpected argument "stray"`},
		{[]string{"--metrics_port", "9004", "stray"}, `unexpected argument "stray"`},
		{[]string{"--insecure", "--token_file", tokenFile(t, 0o600)}, "--insecure together with a credential"},
		{[]string{"--token_file", tokenFile(t, 0o644)}, "chmod 600"},
		{[]string{"--tls_cert", "cert.pem"}, "--tls_cert and --tls_key go together"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr strings.Builder
			err := run(context.Background(), tc.args, io.Discard, &stderr)
			require.Error(t, err)
			assert.Equal(t, 2, exitCode(err), err.Error())
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "\n")
			assert.Empty(t, stderr.String(), "nothing printed but the caller's one line")
		})
	}
}

// Addresses that do not resolve or are not this host's name their flag
// (exit 1: the command line is well formed).
func TestAddressErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--master_server_address", "no-such-host.invalid:50051"}, `--master_server_address "no-such-host.invalid:50051": host "no-such-host.invalid" does not resolve`},
		{[]string{"--local_hostname", "no-such-host.invalid"}, `--local_hostname "no-such-host.invalid": host "no-such-host.invalid" does not resolve`},
		{[]string{"--local_hostname", "192.0.2.1"}, `--local_hostname "192.0.2.1": not an address of this host`},
		{[]string{"--metrics_address", "192.0.2.1", "--local_hostname", "127.0.0.1"}, "--metrics_address/--metrics_port"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"--global_segment_size", "0", "--local_buffer_size", "1 MB", "--metrics_port", "0", "--log_level", "error"}, tc.args...)
			err := run(context.Background(), args, io.Discard, io.Discard)
			require.Error(t, err)
			assert.Equal(t, 1, exitCode(err))
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	var stdout, stderr strings.Builder
	err := run(context.Background(), []string{"-h"}, &stdout, &stderr)
	assert.Equal(t, 0, exitCode(err))
	assert.Contains(t, stderr.String(), "usage: crescent-client")
	assert.Contains(t, stderr.String(), "-global_segment_size")
	stdout.Reset()
	err = run(context.Background(), []string{"--version"}, &stdout, io.Discard)
	assert.Equal(t, 0, exitCode(err))
	assert.True(t, strings.HasPrefix(stdout.String(), "crescent-client "), stdout.String())
}

// The process: -h exits 0, a bad flag 2.
func TestMainExitCodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"-h"}, 0},
		{[]string{"--version"}, 0},
		{[]string{"--global_segment_size", "-1"}, 2},
		{[]string{"stray"}, 2},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), daemonEnv+"="+strings.Join(tc.args, "\x1f"))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		assert.Equal(t, tc.code, code, "%v: %s", tc.args, stderr.String())
		if tc.code == 2 {
			assert.Equal(t, 1, strings.Count(stderr.String(), "\n"), stderr.String())
		}
	}
}

func tokenFile(t *testing.T, mode os.FileMode) string {
	p := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(p, []byte("cluster-token-0123456789abcdef\n"), mode))
	require.NoError(t, os.Chmod(p, mode))
	return p
}
