package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine/mempool"
)

// availableEnv makes the child believe the host has that many bytes
// available, to try the override without allocating more than a test
// may.
const availableEnv = "CRESCENT_CLIENT_TEST_AVAILABLE"

func daemonCmd(args []string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), daemonEnv+"="+strings.Join(args, "\x1f")), env...)
	return cmd
}

// runRefused runs the daemon and wants it to exit non-zero at once,
// naming the flag; it returns stderr.
func runRefused(t *testing.T, args []string, env ...string) string {
	t.Helper()
	cmd := daemonCmd(args, env...)
	// Bounds a failing test only: a daemon that starts runs until killed.
	timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "the daemon did not fail: %v\n%s", err, stderr.String())
	assert.NotZero(t, ee.ExitCode())
	return stderr.String()
}

// The README's "64 GB" on a smaller host: refused before any memory is
// touched (the size is this host's MemAvailable + 1 GiB), naming the flag
// and the override.
func TestRefusesSegmentLargerThanMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	m, err := mempool.Available()
	require.NoError(t, err)
	size := m.Bytes + 1<<30
	stderr := runRefused(t, []string{"--master_server_address", "127.0.0.1:1", "--local_hostname", "127.0.0.1",
		"--global_segment_size", fmt.Sprint(size), "--metrics_address", "127.0.0.1", "--metrics_port", "0"})
	assert.Contains(t, stderr, fmt.Sprintf("--global_segment_size %q", fmt.Sprint(size)))
	assert.Contains(t, stderr, "--allow_overcommit")
	assert.Contains(t, stderr, "MemAvailable")
	assert.Contains(t, stderr, "available")
}

// With a (test) limit of 64 MiB, 128 MB are refused and the buffer counts
// too; --allow_overcommit starts the daemon, which mounts and exits 0 on
// SIGTERM.
func TestAllowOvercommit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	limit := availableEnv + "=" + fmt.Sprint(64<<20)
	tm := startMaster(t, "127.0.0.1:0")
	args := []string{"--master_server_address", tm.addr, "--local_hostname", "127.0.0.1", "--global_segment_size", "128 MB",
		"--local_buffer_size", "4 MB", "--metrics_address", "127.0.0.1", "--metrics_port", "0", "--log_level", "error"}
	stderr := runRefused(t, args, limit)
	assert.Contains(t, stderr, `--global_segment_size "128 MB" plus --local_buffer_size "4 MB" need 132 MiB, more than the 64 MiB available (test limit)`)
	assert.Contains(t, stderr, "at most 60 MiB")

	stderr = runRefused(t, []string{"--master_server_address", tm.addr, "--global_segment_size", "32 MB",
		"--local_buffer_size", "40 MB", "--metrics_address", "127.0.0.1", "--metrics_port", "0"}, limit)
	assert.Contains(t, stderr, "--local_buffer_size")

	cmd := daemonCmd(append(args, "--allow_overcommit"), limit)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	select {
	case l := <-lines:
		require.Contains(t, l, fmt.Sprintf("%d bytes) mounted", 128<<20))
	case <-time.After(60 * time.Second):
		t.Fatal("no output from the daemon")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	for range lines {
	}
	require.NoError(t, <-exited)
	exited <- nil
}
