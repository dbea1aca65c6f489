package ctl

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// TestSecurity: against a master with the cluster and admin tokens,
// crescentctl needs --token_file to talk to it at all and
// --admin_token_file for rm --regex; --insecure with a credential is a
// usage error.
func TestSecurity(t *testing.T) {
	dir := t.TempDir()
	write := func(name, tok string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(tok), 0o600))
		return p
	}
	tok, adm := "cluster-token-0123456789abcdef", "admin-token-0123456789abcdef"
	tokFile, admFile := write("token", tok), write("admin", adm)
	m, err := master.New(master.Config{Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, m.Start())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	svc := service.New(m, service.WithGracePeriod(100*time.Millisecond), service.WithAdminToken([]byte(adm)),
		service.WithTransportSecurity(nil, []byte(tok), nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		m.Close()
	})
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	cl, err := store.New(sctx, store.Config{MasterAddr: lis.Addr().String(), LocalHostname: "127.0.0.1", GlobalSegmentSize: 8 << 20,
		LocalBufferSize: 1 << 20, Logger: quiet, Security: store.Security{Token: []byte(tok)}})
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.Put(sctx, "doc/a", []byte("v"), store.ReplicateConfig{}))

	run := func(args ...string) result {
		return runCtl(context.Background(), "", append([]string{"--master", lis.Addr().String(), "--local_hostname", "127.0.0.1", "--log_level", "error"}, args...)...)
	}
	r := run("rm", "--regex", "doc/.*")
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Contains(t, r.stderr, "cluster token")
	r = run("--token_file", tokFile, "rm", "--regex", "doc/.*")
	assert.Equal(t, 1, r.code, r.stderr)
	assert.Contains(t, r.stderr, "admin credential")
	r = run("--token_file", tokFile, "--admin_token_file", admFile, "rm", "--regex", "doc/.*")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "removed 1\n", r.stdout)
	r = run("--insecure", "--token_file", tokFile, "rm", "--regex", "doc/.*")
	assert.Equal(t, 2, r.code, r.stderr)
	assert.Contains(t, r.stderr, "--insecure together with a credential")
}
