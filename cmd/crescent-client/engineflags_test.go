package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

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
