package main

import (
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every refused command line or config file is an error (main: exit 2)
// in one line that names the flag or key.
func TestRefusedConfig(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", file("typo.yaml", "rpc_port: 6000\nmetric_port: 9100\n")}, "line 2: unknown key metric_port"},
		{[]string{"--config", file("two.yaml", "metric_port: 1\nlog_levle: debug\n")}, "line 1: unknown key metric_port; line 2: unknown key log_levle"},
		{[]string{"--config", file("docs.yaml", "rpc_port: 6000\n---\nrpc_port: 7000\n")}, "more than one YAML document"},
		{[]string{"--config", file("type.yaml", "rpc_port: [1, 2]\n")}, "type.yaml: line 1"},
		{[]string{"--config", file("level.yaml", "log_level: loud\n")}, `log_level "loud"`},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, "--config: open"},
		{[]string{"--log_level", "loud"}, `log_level "loud"`},
		{[]string{"--kv_events_encoding", "xml"}, `kv_events_encoding "xml"`},
		{[]string{"--kv_events_overflow", "spill"}, `kv_events_overflow "spill"`},
		{[]string{"--kv_events_batch_size", "0"}, "kv_events_batch_size 0"},
		{[]string{"--kv_events_queue_size", "-1"}, "kv_events_queue_size -1"},
		{[]string{"--kv_events_replay_buffer_size", "0"}, "kv_events_replay_buffer_size 0"},
		{[]string{"--kv_events_batch_interval_ms", "-1"}, "kv_events_batch_interval_ms -1"},
		{[]string{"--default_kv_soft_pin_ttl", "-1"}, "default_kv_soft_pin_ttl"},
		{[]string{"--put_start_release_timeout_sec", "-1"}, "put_start_release_timeout_sec"},
		{[]string{"--http_metadata_server_port", "70000"}, "http_metadata_server_port 70000"},
		{[]string{"--metrics_port", "50051"}, "rpc_port and metrics_port are both 50051"},
		{[]string{"--enable_http_metadata_server", "--http_metadata_server_port", "9003"}, "http_metadata_server_port 9003"},
		{[]string{"--rpc_address", "no-such-host.invalid"}, `rpc_address "no-such-host.invalid" does not resolve`},
		{[]string{"--http_metadata_server_host", "no-such-host.invalid"}, `http_metadata_server_host "no-such-host.invalid" does not resolve`},
		{[]string{"stray"}, `unexpected argument "stray"`},
		{[]string{"--rpc_port", "6000", "stray"}, `unexpected argument "stray"`},
		{[]string{"--no_such_flag"}, "flag provided but not defined: -no_such_flag"},
		{[]string{"--rpc_port", "many"}, "-rpc_port"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := load(tc.args)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestLoadHelpVersion(t *testing.T) {
	_, err := load([]string{"-h"})
	assert.ErrorIs(t, err, flag.ErrHelp)
	_, err = load([]string{"--version"})
	assert.ErrorIs(t, err, errVersion)
	// An empty file is the defaults.
	p := filepath.Join(t.TempDir(), "empty.yaml")
	require.NoError(t, os.WriteFile(p, nil, 0o600))
	c, err := load([]string{"--config", p})
	require.NoError(t, err)
	assert.Equal(t, defaults(), c)
}

// TestSampleConfig loads docs/master.yaml: every key in it is a setting
// (an unknown one fails the load), its values are the defaults it says
// they are, and it lists every setting.
func TestSampleConfig(t *testing.T) {
	const sample = "../../docs/master.yaml"
	c, err := load([]string{"--config", sample})
	require.NoError(t, err)
	assert.Equal(t, defaults(), c, "%s: the sample's values are the defaults", sample)

	b, err := os.ReadFile(sample)
	require.NoError(t, err)
	listed := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, _, ok := strings.Cut(line, ":"); ok && k != "" && !strings.HasPrefix(k, "#") && !strings.HasPrefix(k, " ") {
			listed[k] = true
		}
	}
	var missing []string
	var walk func(rt reflect.Type)
	walk = func(rt reflect.Type) {
		for i := range rt.NumField() {
			name, opts, _ := strings.Cut(rt.Field(i).Tag.Get("yaml"), ",")
			switch {
			case opts == "inline":
				walk(rt.Field(i).Type)
			case name != "" && !listed[name]:
				missing = append(missing, name)
			}
		}
	}
	walk(reflect.TypeOf(config{}))
	assert.Empty(t, missing, "keys missing from %s (add them, with a comment)", sample)
}

// The process: -h and --version exit 0, a bad flag or config 2, in one
// line naming it; an address that cannot be bound exits 1 naming its
// flags.
func TestMainExitCodes(t *testing.T) {
	typo := filepath.Join(t.TempDir(), "typo.yaml")
	require.NoError(t, os.WriteFile(typo, []byte("metric_port: 9100\n"), 0o600))
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"-h"}, 0, "usage: crescent-master"},
		{[]string{"--version"}, 0, ""},
		{[]string{"--config", typo}, 2, "crescent-master: --config " + typo + ": line 1: unknown key metric_port\n"},
		{[]string{"--log_level", "loud"}, 2, "crescent-master: log_level \"loud\": want debug, info, warn or error\n"},
		{[]string{"stray"}, 2, "crescent-master: unexpected argument \"stray\" (settings are flags, or keys of --config)\n"},
		{[]string{"--rpc_address", "192.0.2.1", "--rpc_port", "0", "--metrics_port", "0", "--log_level", "error"}, 1,
			"crescent-master: --rpc_address/--rpc_port: cannot listen on 192.0.2.1:0: bind: cannot assign requested address\n"},
	} {
		cmd := exec.Command(os.Args[0], tc.args...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		assert.Equal(t, tc.code, code, "%v: %s", tc.args, stderr.String())
		if tc.code == 0 && tc.stderr != "" {
			assert.Contains(t, stderr.String(), tc.stderr)
		} else if tc.stderr != "" {
			assert.Equal(t, tc.stderr, stderr.String(), tc.args)
		}
	}
	cmd := exec.Command(os.Args[0], "--version")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.Output()
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(out), "crescent-master "), string(out))
}
