package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLogFormatJSON: the daemon process with --log_format json writes
// only JSON lines on stderr, gRPC's own (component grpc) among them.
func TestLogFormatJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	tm := startMaster(t, "127.0.0.1:0")
	args := []string{"--master_server_address", tm.addr, "--master_protocol", "grpc", "--local_hostname", "127.0.0.1",
		"--global_segment_size", "16 MB", "--local_buffer_size", "4 MB", "--metrics_address", "127.0.0.1", "--metrics_port", "0",
		"--log_level", "debug", "--log_format", "json"}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), daemonEnv+"="+strings.Join(args, "\x1f"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill() })
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "crescent-client: metrics on ") {
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	for sc.Scan() {
	}
	require.NoError(t, cmd.Wait(), "exit 0 after SIGTERM: %s", stderr.String())

	components := map[string]int{}
	lines := bufio.NewScanner(&stderr)
	for lines.Scan() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(lines.Bytes(), &rec), "not JSON: %q", lines.Text())
		require.Contains(t, rec, "msg", lines.Text())
		if c, ok := rec["component"].(string); ok {
			components[c]++
		}
	}
	assert.Positive(t, components["grpc"], "a line from gRPC")
}
