package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testsvc"
)

// TestLogFormatJSON runs the master process with --log_format json and
// the log in etcd: every line on stderr is one JSON object, the master's
// own and those of etcd's client and of gRPC (both routed through the
// same handler, with component etcd and grpc).
func TestLogFormatJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	e := testsvc.StartEtcd(t)
	p, _ := startMaster(t, "--rpc_address", "127.0.0.1", "--rpc_port", strconv.Itoa(testsvc.FreePort(t)), "--metrics_port", "0",
		"--oplog", e.URL(), "--cluster_id", "logjson", "--log_level", "debug", "--log_format", "json")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	go func() {
		for range p.lines {
		}
	}()
	<-p.done
	require.NoError(t, p.waitErr, "exit 0 after SIGTERM")

	components := map[string]int{}
	var msgs []string
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	for sc.Scan() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec), "not JSON: %q", sc.Text())
		for _, k := range []string{"time", "level", "msg"} {
			require.Contains(t, rec, k, sc.Text())
		}
		msgs = append(msgs, rec["msg"].(string))
		if c, ok := rec["component"].(string); ok {
			components[c]++
		}
	}
	assert.Contains(t, msgs, "crescent-master serving")
	assert.Positive(t, components["etcd"], "a line from etcd's client: %v", msgs)
	assert.Positive(t, components["grpc"], "a line from gRPC: %v", msgs)
}

// A bad --log_format exits 2 in one line naming the setting.
func TestLogFormatRefused(t *testing.T) {
	for _, args := range [][]string{{"--log_format", "xml"}, {"--log_format", "JSON"}} {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "%v: %v", args, err)
		assert.Equal(t, 2, ee.ExitCode())
		assert.Equal(t, "crescent-master: log_format \""+args[1]+"\": want text or json\n", stderr.String())
	}
	c, err := load([]string{"--log_format", "json"})
	require.NoError(t, err)
	assert.Equal(t, "json", c.LogFormat)
	// The YAML key, and the flag over it.
	path := filepath.Join(t.TempDir(), "m.yaml")
	require.NoError(t, os.WriteFile(path, []byte("log_format: json\nlog_level: debug\n"), 0o600))
	c, err = load([]string{"--config", path})
	require.NoError(t, err)
	assert.Equal(t, "json", c.LogFormat)
	assert.Equal(t, "debug", c.LogLevel)
	c, err = load([]string{"--config", path, "--log_format", "text"})
	require.NoError(t, err)
	assert.Equal(t, "text", c.LogFormat)
	require.NoError(t, os.WriteFile(path, []byte("log_format: xml\n"), 0o600))
	_, err = load([]string{"--config", path})
	assert.EqualError(t, err, `log_format "xml": want text or json`)
}
