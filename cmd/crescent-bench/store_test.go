package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStoreMainJSON(t *testing.T) {
	var out bytes.Buffer
	err := storeMain(context.Background(), []string{
		"--operation", "mixed", "--value_size", "64KiB", "--segment_size", "32MiB", "--local_buffer_size", "8MiB",
		"--duration", "0.2", "--warmup", "0", "--baseline", "none", "--json",
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("%v: %q", err, out.String())
	}
	for k, want := range map[string]any{"operation": "mixed", "value_size": float64(64 << 10), "clients": float64(2), "threads": float64(2), "baseline": "none", "zero_copy": true} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	for _, k := range []string{"ops_per_sec", "throughput_gbps", "baseline_gbps", "ratio", "p50_us", "p99_us", "p999_us", "duration_s"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
}

// TestStoreMainLocationCache: with --location_cache the gets' hit share
// is reported and repeated gets hit; without it the field is absent.
func TestStoreMainLocationCache(t *testing.T) {
	for _, lc := range []string{"0", "4096"} {
		var out bytes.Buffer
		err := storeMain(context.Background(), []string{
			"--operation", "get", "--value_size", "4KiB", "--segment_size", "32MiB", "--local_buffer_size", "8MiB",
			"--duration", "0.5", "--warmup", "0", "--baseline", "none", "--json", "--location_cache", lc,
		}, &out)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(out.Bytes(), &m), out.String())
		if lc == "0" {
			assert.NotContains(t, m, "location_hit_share")
			continue
		}
		assert.EqualValues(t, 4096, m["location_cache"])
		assert.Greater(t, m["location_hit_share"], 0.0, "some gets repeat a key")
		assert.LessOrEqual(t, m["location_hit_share"], 1.0)
	}
}

func TestStoreMainText(t *testing.T) {
	var out bytes.Buffer
	err := storeMain(context.Background(), []string{
		"--operation", "meta", "--objects", "1000", "--batch", "100", "--warmup", "0",
	}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "1000 objects") || !strings.Contains(out.String(), "objects/s") {
		t.Fatalf("meta output %q", out.String())
	}
}

func TestStoreMainFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--value_size", "big"},
		{"--segment_size", "0"},
		{"--duration", "0"},
		{"--operation", "erase"},
		{"--baseline", "memcached"},
		{"--oplog", "tape"},
		{"--baseline", "oplog_off"},
		{"--baseline", "engine", "--operation", "meta"},
		{"--baseline", "engine", "--zero_copy=false"},
		{"stray"},
	} {
		if err := storeMain(context.Background(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// With the log on, the text names it and prints the log-off baseline
// of the same run and the ratio.
func TestStoreMainOplog(t *testing.T) {
	for _, op := range []string{"put", "meta"} {
		var out bytes.Buffer
		err := storeMain(context.Background(), []string{
			"--operation", op, "--objects", "1000", "--batch", "100", "--value_size", "64KiB", "--segment_size", "32MiB",
			"--local_buffer_size", "8MiB", "--duration", "0.3", "--warmup", "0", "--oplog", "local", "--oplog_dir", t.TempDir(),
		}, &out)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"oplog local", "oplog_off (same run)", "ratio crescent/oplog_off"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s output lacks %q: %q", op, want, out.String())
			}
		}
		if op == "put" {
			// Every put's answer waited for its commit: the split by RPC
			// names it.
			require.Regexp(t, `oplog waits by RPC \(answers x mean wait\): .*commit_put [1-9][0-9]* x [0-9]+ us`, out.String())
		}
	}
}

func TestStoreMainTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.trace")
	var out bytes.Buffer
	err := storeMain(context.Background(), []string{
		"--operation", "meta", "--objects", "1000", "--batch", "100", "--warmup", "0", "--trace", path,
	}, &out)
	require.NoError(t, err)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	// runtime/trace's header ("go 1.NN trace"), then the run's events.
	require.Regexp(t, `^go 1\.[0-9]+ trace`, string(b[:min(len(b), 16)]))
	assert.Greater(t, len(b), 1024, "a trace of a whole run holds more than its header")
}

func TestStoreMainCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	err := storeMain(context.Background(), []string{
		"--operation", "meta", "--objects", "1000", "--batch", "100", "--warmup", "0", "--cpuprofile", path,
	}, io.Discard)
	require.NoError(t, err)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	// A pprof profile is gzip-compressed protobuf.
	require.GreaterOrEqual(t, len(b), 2)
	assert.Equal(t, []byte{0x1f, 0x8b}, b[:2])
}

// TestStoreMainMemProfile: --memprofile writes an allocation profile
// that holds the run's allocations (the master's among them).
func TestStoreMainMemProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mem.prof")
	err := storeMain(context.Background(), []string{
		"--operation", "meta", "--objects", "1000", "--batch", "100", "--warmup", "0", "--memprofile", path,
	}, io.Discard)
	require.NoError(t, err)
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f) // a pprof profile is gzip-compressed protobuf
	require.NoError(t, err)
	b, err := io.ReadAll(zr)
	require.NoError(t, err)
	// The string table names the sample types and the functions sampled.
	assert.Contains(t, string(b), "alloc_space")
	assert.Contains(t, string(b), "crescent/store/master.")
}

func TestStoreMainTraceUnwritable(t *testing.T) {
	err := storeMain(context.Background(), []string{
		"--operation", "meta", "--objects", "1000", "--batch", "100", "--warmup", "0",
		"--trace", filepath.Join(t.TempDir(), "no", "such", "dir", "run.trace"),
	}, io.Discard)
	require.Error(t, err)
}
