package ctl

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/syncbuf"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store"
)

// buildCtl builds cmd/crescentctl into a temporary directory.
func buildCtl(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "crescentctl")
	out, err := exec.Command(goBin, "build", "-o", bin, "../cmd/crescentctl").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

func exitCode(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// TestBinary runs the built crescentctl against a real master: exit
// codes, a put and get through stdin and stdout, and events stopped by
// SIGINT.
func TestBinary(t *testing.T) {
	bin := buildCtl(t)
	c := startCluster(t)
	run := func(stdin string, args ...string) (int, string, string) {
		cmd := exec.Command(bin, append([]string{"--master", c.rpc, "--admin", c.admin, "--local_hostname", "127.0.0.1"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		return exitCode(t, cmd.Run()), out.String(), errb.String()
	}
	code, out, _ := run("", "-h")
	assert.Equal(t, ExitOK, code)
	assert.Contains(t, out, "exit codes")
	code, out, _ = run("", "--version")
	assert.Equal(t, ExitOK, code)
	assert.True(t, strings.HasPrefix(out, "crescentctl "), out)
	code, _, stderr := run("", "ls", "--prefixx", "a")
	assert.Equal(t, ExitUsage, code)
	assert.Equal(t, "crescentctl: ls: flag provided but not defined: -prefixx (see crescentctl -h)\n", stderr)

	code, out, stderr = run("value through the binary", "put", "bin/k", "-")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, "OK\n", out)
	code, out, stderr = run("", "get", "bin/k")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, "value through the binary", out)
	code, _, stderr = run("", "get", "bin/missing")
	assert.Equal(t, ExitNotFound, code, stderr)
	code, out, _ = run("", "ls")
	assert.Equal(t, ExitOK, code)
	assert.Equal(t, "bin/k\n", out)

	// events until SIGINT: exit 0.
	require.NoError(t, c.client.Put(context.Background(), "0x33", []byte("block"), store.ReplicateConfig{}))
	cmd := exec.Command(bin, "events", "--events", c.events, "--replay", c.replay, "--replay-from", "0")
	var evOut, evErr syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &evOut, &evErr
	require.NoError(t, cmd.Start())
	testutil.Eventually(t, "the batch printed", func() bool { return strings.Contains(evOut.String(), "hashes=[0x33]") })
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	assert.Equal(t, ExitOK, exitCode(t, cmd.Wait()), evErr.String())
}
