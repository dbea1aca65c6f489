package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/testpki"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/internal/vethtest"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

func tokenFile(t *testing.T, body string, mode os.FileMode) string {
	p := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(p, []byte(body), mode))
	require.NoError(t, os.Chmod(p, mode))
	return p
}

// TestSecurityFlags: --insecure with a credential, a token file others
// can read and half a TLS pair are refused at start (exit 2).
func TestSecurityFlags(t *testing.T) {
	tok := tokenFile(t, "cluster-token-0123456789abcdef\n", 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--insecure", "--token_file", tok}, "--insecure together with a credential"},
		{[]string{"--token_file", tokenFile(t, "cluster-token-0123456789abcdef\n", 0o644)}, "chmod 600"},
		{[]string{"--admin_token_file", tokenFile(t, "short", 0o600)}, "admin token file"},
		{[]string{"--tls_cert", tok}, "--tls_cert and --tls_key go together"},
	} {
		cmd := exec.Command(os.Args[0], append(tc.args, "--rpc_port", "0", "--metrics_port", "0")...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v", tc.args)
		assert.Equal(t, 2, ee.ExitCode(), "%v: %s", tc.args, stderr.String())
		assert.Contains(t, stderr.String(), tc.want)
	}
}

// TestSecurityYAML: the security keys of --config (auth.FlagValues
// inline) are read, a flag on the command line wins over its key, and
// --insecure with a token from the file is refused like on the command
// line.
func TestSecurityYAML(t *testing.T) {
	fileTok := tokenFile(t, "file-token-0123456789abcdef\n", 0o600)
	flagTok := tokenFile(t, "flag-token-0123456789abcdef\n", 0o600)
	adm := tokenFile(t, "admin-token-0123456789abcdef\n", 0o600)
	conf := filepath.Join(t.TempDir(), "master.yaml")
	require.NoError(t, os.WriteFile(conf, []byte("token_file: "+fileTok+"\nadmin_token_file: "+adm+"\n"), 0o600))

	c, err := load([]string{"--config", conf})
	require.NoError(t, err)
	assert.Equal(t, auth.FlagValues{TokenFile: fileTok, AdminTokenFile: adm}, c.FlagValues)
	c, err = load([]string{"--config", conf, "--token_file", flagTok})
	require.NoError(t, err)
	assert.Equal(t, auth.FlagValues{TokenFile: flagTok, AdminTokenFile: adm}, c.FlagValues, "the flag wins")

	_, err = load([]string{"--config", conf, "--insecure"})
	assert.ErrorIs(t, err, auth.ErrInsecureWithCredential)
	open := filepath.Join(t.TempDir(), "open.yaml")
	require.NoError(t, os.WriteFile(open, []byte("insecure: true\n"), 0o600))
	c, err = load([]string{"--config", open})
	require.NoError(t, err)
	assert.True(t, c.Insecure)
	c, err = load([]string{"--config", open, "--insecure=false"})
	require.NoError(t, err)
	assert.False(t, c.Insecure, "the flag wins")
}

// greetedFrom reports whether a ZMTP peer at addr, dialled from from,
// sends its greeting (a refused connection is closed without a byte).
func greetedFrom(addr string, from net.IP) bool {
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// A ZMTP 3 greeting's signature: the peer answers with its own.
	if _, err := c.Write([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f}); err != nil {
		return false
	}
	n, _ := c.Read(make([]byte, 10))
	return n > 0
}

func healthFrom(addr string, from net.IP) error {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: from}}).DialContext}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + addr + "/health")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// TestProtectedDefaultProcess: crescent-master with no credential says
// so in one line and serves its RPC and admin ports to loopback peers
// only (a peer on the host's non-loopback veth address is turned away);
// --insecure serves that peer.
func TestProtectedDefaultProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	p := vethtest.New(t)
	host := net.ParseIP(p.HostIP)
	for _, insecure := range []bool{false, true} {
		port, admin, ev, replay := testsvc.FreePort(t), testsvc.FreePort(t), testsvc.FreePort(t), testsvc.FreePort(t)
		args := []string{"--rpc_address", "0.0.0.0", "--rpc_port", strconv.Itoa(port), "--metrics_port", strconv.Itoa(admin),
			"--enable_kv_events", "--kv_events_endpoint", "tcp://*:" + strconv.Itoa(ev), // "*": bind (vLLM's rule)
			"--kv_events_replay_endpoint", "tcp://*:" + strconv.Itoa(replay)}
		if insecure {
			args = append(args, "--insecure")
		}
		proc, _ := startMaster(t, args...)
		rpcAt := func(h string) string { return net.JoinHostPort(h, strconv.Itoa(port)) }
		httpAt := func(h string) string { return net.JoinHostPort(h, strconv.Itoa(admin)) }
		require.NoError(t, testsvc.MasterReady(rpcAt("127.0.0.1"), nil))
		require.NoError(t, healthFrom(httpAt("127.0.0.1"), net.IPv4(127, 0, 0, 1)))
		require.True(t, greetedFrom(net.JoinHostPort("127.0.0.1", strconv.Itoa(ev)), nil), "events port from loopback")
		rpcErr, httpErr := testsvc.MasterReady(rpcAt(p.HostIP), host), healthFrom(httpAt(p.HostIP), host)
		evServed := greetedFrom(net.JoinHostPort(p.HostIP, strconv.Itoa(ev)), host)
		replayServed := greetedFrom(net.JoinHostPort(p.HostIP, strconv.Itoa(replay)), host)
		proc.cmd.Process.Signal(syscall.SIGTERM)
		<-proc.done
		assert.Equal(t, insecure, evServed, "KV-event port from a non-loopback peer (insecure %v)", insecure)
		assert.Equal(t, insecure, replayServed, "KV-event replay port from a non-loopback peer (insecure %v)", insecure)
		if insecure {
			assert.NoError(t, rpcErr)
			assert.NoError(t, httpErr)
			assert.Contains(t, proc.stderr.String(), "--insecure: accepting any peer WITHOUT authentication")
			continue
		}
		assert.Error(t, rpcErr, "RPC from a non-loopback peer")
		assert.Error(t, httpErr, "HTTP from a non-loopback peer")
		assert.Equal(t, 1, strings.Count(proc.stderr.String(), "accepting loopback peers only"), proc.stderr.String())
	}
}

// TestTokensProcess: with --token_file and --admin_token_file, a store
// client holding the cluster token works, one without it is refused, and
// RemoveAll needs the admin token.
func TestTokensProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	tok := tokenFile(t, "cluster-token-0123456789abcdef\n", 0o600)
	adm := tokenFile(t, "admin-token-0123456789abcdef\n", 0o600)
	port := testsvc.FreePort(t)
	startMaster(t, "--rpc_address", "127.0.0.1", "--rpc_port", strconv.Itoa(port), "--metrics_port", "0",
		"--token_file", tok, "--admin_token_file", adm)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	ctx := context.Background()
	base := store.Config{MasterAddr: addr, GlobalSegmentSize: 8 << 20, LocalBufferSize: 4 << 20, Protocols: []string{"tcp"}, LocalHostname: "127.0.0.1"}
	_, err := store.New(ctx, base)
	require.ErrorIs(t, err, crpc.ErrTokenRequired)

	cfg := base
	cfg.TokenFile = tok
	c, err := store.New(ctx, cfg)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Put(ctx, "k", []byte("v"), store.ReplicateConfig{}))
	_, err = c.RemoveAll(ctx, true)
	require.ErrorIs(t, err, errcode.ErrIllegalClient)

	acfg := base
	acfg.TokenFile, acfg.AdminTokenFile, acfg.GlobalSegmentSize = tok, adm, 0
	a, err := store.New(ctx, acfg)
	require.NoError(t, err)
	defer a.Close()
	n, err := a.RemoveAll(ctx, true)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
}

// TestTLSProcess: with --tls_cert/--tls_key/--tls_ca the RPC port serves
// clients presenting a certificate of the CA and refuses a plaintext
// one, and the admin port speaks https with client certificates.
func TestTLSProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	pki := testpki.New(t)
	dir := t.TempDir()
	ca := pki.WriteCA(t, dir)
	scert, skey := testpki.WritePair(t, dir, "server", pki.Server)
	ccert, ckey := testpki.WritePair(t, dir, "client", pki.Client)
	port, admin := testsvc.FreePort(t), testsvc.FreePort(t)
	startMaster(t, "--rpc_address", "127.0.0.1", "--rpc_port", strconv.Itoa(port), "--metrics_port", strconv.Itoa(admin),
		"--tls_cert", scert, "--tls_key", skey, "--tls_ca", ca)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	ctx := context.Background()
	base := store.Config{MasterAddr: addr, GlobalSegmentSize: 8 << 20, LocalBufferSize: 4 << 20, Protocols: []string{"tcp"}, LocalHostname: "127.0.0.1"}
	_, err := store.New(ctx, base)
	require.ErrorIs(t, err, crpc.ErrTLSRequired)
	cfg := base
	cfg.TLSCA, cfg.TLSCert, cfg.TLSKey = ca, ccert, ckey
	c, err := store.New(ctx, cfg)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Put(ctx, "k", []byte("v"), store.ReplicateConfig{}))

	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: pki.ClientTLS(true)}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://127.0.0.1:" + strconv.Itoa(admin) + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	plain := &http.Client{Timeout: 5 * time.Second}
	defer plain.CloseIdleConnections()
	if resp, err := plain.Get("http://127.0.0.1:" + strconv.Itoa(admin) + "/health"); err == nil {
		resp.Body.Close()
		assert.NotEqual(t, http.StatusOK, resp.StatusCode, "plaintext on the TLS admin port")
	}
}
