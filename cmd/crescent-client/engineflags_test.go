package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"

	"github.com/stretchr/testify/require"
)

func TestEngineSecurityFlags(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tok, []byte("0123456789abcdef0123456789abcdef\n"), 0o600))
	open := filepath.Join(dir, "open")
	require.NoError(t, os.WriteFile(open, []byte("0123456789abcdef0123456789abcdef\n"), 0o644))

	o, err := parseFlags([]string{"--token_file", tok}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "0123456789abcdef0123456789abcdef", string(o.engineSec.token))
	require.True(t, o.engineSec.set())

	o, err = parseFlags(nil, io.Discard)
	require.NoError(t, err)
	require.False(t, o.engineSec.set(), "no flag: the store client starts its engine in the protected default")

	for _, args := range [][]string{
		{"--token_file", tok, "--mooncake_compat"},
		{"--token_file", tok, "--insecure"},
		{"--token_file", open},
		{"--token_file", filepath.Join(dir, "missing")},
	} {
		_, err := parseFlags(args, io.Discard)
		require.Error(t, err, "%v", args)
		require.Equal(t, 2, exitCode(err), "%v: %v", args, err)
	}
	_, err = parseFlags([]string{"--token_file", tok, "--mooncake_compat"}, io.Discard)
	require.ErrorContains(t, err, "--mooncake_compat")
	require.ErrorContains(t, err, "--token_file")
}

// TestDaemonEngineToken: the daemon with --token_file serves its
// descriptor only to a peer holding the token.
func TestDaemonEngineToken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	token := []byte("0123456789abcdef0123456789abcdef")
	tok := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tok, token, 0o600))
	tm := startMasterToken(t, "127.0.0.1:0", token) // one cluster token: the master's port and the engines'
	args := []string{"--master_server_address", tm.addr, "--local_hostname", "127.0.0.1", "--global_segment_size", "16 MB",
		"--local_buffer_size", "4 MB", "--metrics_address", "127.0.0.1", "--metrics_port", "0", "--log_level", "error",
		"--token_file", tok}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), daemonEnv+"="+strings.Join(args, "\x1f"))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	sm := segLine.FindStringSubmatch(line)
	require.NotNil(t, sm, "no segment line: %q", line)
	seg := sm[1]

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := metadata.Client{Token: token}.FetchDesc(ctx, seg, nil)
	require.NoError(t, err)
	require.Equal(t, seg, d.Name)
	_, err = metadata.Client{Token: []byte("fedcba9876543210fedcba9876543210")}.FetchDesc(ctx, seg, nil)
	require.Error(t, err)
	_, err = metadata.FetchDesc(ctx, seg, nil)
	require.Error(t, err, "the daemon's engine served a descriptor without the token")
}
