package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testutil"
)

// Every refused command line exits 2 with one line naming what is wrong.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--no_such_flag", "ls"}, "-no_such_flag"},
		{[]string{"ls", "--no_such_flag"}, "-no_such_flag"},
		{[]string{"get"}, "get: missing arguments"},
		{[]string{"get", "a", "b"}, `get: unexpected argument "b"`},
		{[]string{"put", "k"}, "put: missing arguments"},
		{[]string{"put", "k", "f", "--replicas", "0"}, "--replicas 0"},
		{[]string{"ls", "extra"}, `ls: unexpected argument "extra"`},
		{[]string{"segments", "x"}, `unexpected argument "x"`},
		{[]string{"rm"}, "rm: missing KEY"},
		{[]string{"rm", "k", "--regex", "a"}, "not both"},
		{[]string{"rm", "--regex", "a("}, "--regex"},
		{[]string{"-o", "yaml", "ls"}, `-o "yaml"`},
		{[]string{"ls", "-o", "xml"}, `-o "xml"`},
		{[]string{"--log_level", "loud", "ls"}, `--log_level "loud"`},
		{[]string{"ls", "--log_format", "xml"}, `--log_format "xml": want text or json`},
		{[]string{"--timeout", "0s", "ls"}, "--timeout"},
		{[]string{"--timeout", "soon", "ls"}, "-timeout"},
		{[]string{"--buffer_size", "-1", "get", "k"}, "--buffer_size"},
		{[]string{"--buffer_size", "lots", "get", "k"}, "--buffer_size"},
		{[]string{"--admin", "nohost", "ls"}, `--admin "nohost"`},
		{[]string{"--master", "nohost", "get", "k"}, `--master "nohost"`},
		{[]string{"--master", "", "get", "k"}, "--master"},
		{[]string{"events", "--replay-from", "x"}, "--replay-from"},
		{[]string{"events", "--replay-from", "-3"}, "--replay-from"},
		{[]string{"events", "--count", "-1"}, "--count"},
		{[]string{"events", "--replay", "", "--replay-from", "0"}, "needs --replay"},
		{[]string{"events", "--events", "udp://x:1"}, "events:"},
		{[]string{"get", "k", "--file"}, "-file"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := runCtl(context.Background(), "", tc.args...)
			assert.Equal(t, ExitUsage, r.code, r.stderr)
			assert.Contains(t, r.stderr, tc.want)
			assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
			assert.Empty(t, r.stdout)
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}, {"get", "-h"}, {"events", "--help"}, {"--master", "x:1", "rm", "-h"}} {
		r := runCtl(context.Background(), "", args...)
		assert.Equal(t, ExitOK, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stdout, "usage: crescentctl", args)
	}
	r := runCtl(context.Background(), "", "-h")
	for _, s := range []string{"put KEY FILE|-", "events", "exit codes: 0 ok, 1 error, 2 usage error, 3 key not found", "-master"} {
		assert.Contains(t, r.stdout, s)
	}
	for _, args := range [][]string{{"--version"}, {"ls", "--version"}} {
		r := runCtl(context.Background(), "", args...)
		assert.Equal(t, ExitOK, r.code)
		assert.True(t, strings.HasPrefix(r.stdout, "crescentctl "), r.stdout)
	}
}

func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args, pos []string
		file      string
	}{
		{[]string{"k", "--file", "f"}, []string{"k"}, "f"},
		{[]string{"--file", "f", "k"}, []string{"k"}, "f"},
		{[]string{"a", "--file=f", "b"}, []string{"a", "b"}, "f"},
		{[]string{"--", "-k", "--file", "f"}, []string{"-k", "--file", "f"}, ""},
		{[]string{"k", "-"}, []string{"k", "-"}, ""},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		file := fs.String("file", "", "")
		pos, err := parseInterspersed(fs, tc.args)
		require.NoError(t, err, tc.args)
		assert.Equal(t, tc.pos, pos, tc.args)
		assert.Equal(t, tc.file, *file, tc.args)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1": 1, "16MiB": 16 << 20, "64k": 64 << 10, "1G": 1 << 30, " 2 MB ": 2 << 20} {
		n, err := parseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, n, in)
	}
	for _, in := range []string{"", "-1", "1.5M", "1T", "M", "99999999999G"} {
		_, err := parseSize(in)
		assert.Error(t, err, in)
	}
}

// TestEndToEnd drives every store and admin command against a real
// master with a real client contributing the memory.
func TestEndToEnd(t *testing.T) {
	c := startCluster(t)
	dir := t.TempDir()

	// put from a file larger than the staging pool, and from stdin.
	big := make([]byte, 3<<20+17)
	testutil.Fill(big, 7)
	src := filepath.Join(dir, "big.bin")
	require.NoError(t, os.WriteFile(src, big, 0o600))
	r := c.ctl(t, "", "put", "big", src, "--buffer_size", "1MiB")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.Equal(t, "OK\n", r.stdout)
	r = c.ctl(t, "hello from stdin", "put", "doc/a", "-")
	require.Equal(t, ExitOK, r.code, r.stderr)
	r = c.ctl(t, "second", "-o", "json", "put", "doc/b", "-", "--replicas", "1")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.JSONEq(t, `{"key":"doc/b","size":6}`, r.stdout)

	// get to stdout and to a file.
	r = c.ctl(t, "", "get", "doc/a")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.Equal(t, "hello from stdin", r.stdout)
	dst := filepath.Join(dir, "out.bin")
	r = c.ctl(t, "", "get", "big", "--file", dst, "--buffer_size", "1MiB")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.Empty(t, r.stdout)
	got, err := os.ReadFile(dst)
	require.NoError(t, err)
	require.True(t, bytes.Equal(big, got), testutil.FirstDiff(got, big))

	// ls, text and json, with and without a prefix.
	r = c.ctl(t, "", "ls")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.Equal(t, "big\ndoc/a\ndoc/b\n", r.stdout)
	r = c.ctl(t, "", "ls", "--prefix", "doc/", "-o", "json")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.JSONEq(t, `["doc/a","doc/b"]`, r.stdout)
	r = c.ctl(t, "", "-o", "json", "ls", "--prefix", "none/")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.JSONEq(t, `[]`, r.stdout)

	// stat.
	r = c.ctl(t, "", "stat", "big")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "size      3145745")
	assert.Contains(t, r.stdout, "replicas  1")
	assert.Contains(t, r.stdout, "segment "+c.segName)
	r = c.ctl(t, "", "stat", "big", "-o", "json")
	require.Equal(t, ExitOK, r.code, r.stderr)
	var k KeyInfo
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &k))
	assert.Equal(t, uint64(len(big)), k.Size)
	assert.True(t, k.Complete)
	require.Len(t, k.Replicas, 1)
	assert.Equal(t, c.segName, k.Replicas[0].Segment)
	assert.Equal(t, "COMPLETE", k.Replicas[0].Status)

	// segments and clients.
	r = c.ctl(t, "", "segments")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "NAME")
	assert.Contains(t, r.stdout, c.segName)
	r = c.ctl(t, "", "segments", "-o", "json")
	require.Equal(t, ExitOK, r.code, r.stderr)
	var segs []SegmentInfo
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &segs))
	require.Len(t, segs, 1)
	assert.Equal(t, uint64(32<<20), segs[0].Capacity)
	assert.Equal(t, c.segName, segs[0].Name)
	assert.NotZero(t, segs[0].Used)
	r = c.ctl(t, "", "clients", "-o", "json")
	require.Equal(t, ExitOK, r.code, r.stderr)
	var cls []ClientInfo
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &cls))
	require.Len(t, cls, 1)
	assert.Equal(t, segs[0].Client, cls[0].ID)
	assert.Equal(t, []string{c.segName}, cls[0].Segments)
	r = c.ctl(t, "", "clients")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, segs[0].Client)

	// health.
	r = c.ctl(t, "", "health")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.Equal(t, "OK\n", r.stdout)
	r = c.ctl(t, "", "health", "-o", "json")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.JSONEq(t, `{"healthy":true,"status":"OK"}`, r.stdout)

	// rm one key, then by regex; what is gone is "not found" (exit 3).
	r = c.ctl(t, "", "rm", "doc/a") // read a moment ago: leased
	require.Equal(t, ExitError, r.code, r.stderr)
	assert.Contains(t, r.stderr, "--force")
	r = c.ctl(t, "", "rm", "doc/a", "--force")
	require.Equal(t, ExitOK, r.code, r.stderr)
	for _, args := range [][]string{{"get", "doc/a"}, {"stat", "doc/a"}, {"rm", "doc/a"}} {
		r = c.ctl(t, "", args...)
		assert.Equal(t, ExitNotFound, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stderr, "doc/a")
		assert.Empty(t, r.stdout)
	}
	r = c.ctl(t, "", "rm", "--regex", "(doc/|bi).*", "--force", "-o", "json")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.JSONEq(t, `{"removed":2}`, r.stdout)
	r = c.ctl(t, "", "ls")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.Empty(t, r.stdout)
}

// A key that starts with "-" after "--".
func TestDashKey(t *testing.T) {
	c := startCluster(t)
	r := c.ctl(t, "v", "put", "--", "-k", "-")
	require.Equal(t, ExitOK, r.code, r.stderr)
	r = c.ctl(t, "", "get", "--", "-k")
	require.Equal(t, ExitOK, r.code, r.stderr)
	assert.Equal(t, "v", r.stdout)
}

// Unreachable and unresolvable addresses name the flag (exit 1).
func TestAddressErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--master", "no-such-host.invalid:50051", "get", "k"}, `--master "no-such-host.invalid:50051": host "no-such-host.invalid" does not resolve`},
		{[]string{"--admin", "no-such-host.invalid:9003", "ls"}, "--admin no-such-host.invalid:9003"},
		{[]string{"--admin", "127.0.0.1:1", "health"}, "--admin 127.0.0.1:1"},
		{[]string{"--admin", "127.0.0.1:1", "segments"}, "--admin 127.0.0.1:1"},
	} {
		r := runCtl(context.Background(), "", tc.args...)
		assert.Equal(t, ExitError, r.code, "%v: %s", tc.args, r.stderr)
		assert.Contains(t, r.stderr, tc.want, tc.args)
	}
}

// put refuses an empty or missing file before it talks to the master.
func TestPutBadFile(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	r := runCtl(context.Background(), "", "--master", "127.0.0.1:1", "put", "k", empty)
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.stderr, "is empty")
	r = runCtl(context.Background(), "", "--master", "127.0.0.1:1", "put", "k", filepath.Join(t.TempDir(), "missing"))
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.stderr, "no such file")
}
