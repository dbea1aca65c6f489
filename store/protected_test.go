package store

import (
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/internal/vethtest"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

func masterOn(t *testing.T, host string, opts ...service.Option) string {
	lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	return startSecureMaster(t, master.Config{}, lis, opts...).addr
}

// TestProtectedDefaultWiring: the master's RPC port in the protected
// mode (no credential, no --insecure) serves a loopback peer and turns
// away a peer on a non-loopback address of this host before reading
// anything; --insecure serves both. The host side of a veth pair gives
// the non-loopback address.
func TestProtectedDefaultWiring(t *testing.T) {
	p := vethtest.New(t)
	host := net.ParseIP(p.HostIP)
	protected := masterOn(t, "0.0.0.0", service.WithTransportSecurity(nil, nil, auth.Protected.Allow()))
	_, port, _ := net.SplitHostPort(protected)
	require.NoError(t, testsvc.MasterReady(net.JoinHostPort("127.0.0.1", port), nil), "loopback peer")
	err := testsvc.MasterReady(net.JoinHostPort(p.HostIP, port), host)
	require.Error(t, err, "a non-loopback peer: closed before the preface (EOF or a reset)")

	open := masterOn(t, "0.0.0.0", service.WithTransportSecurity(nil, nil, auth.Insecure.Allow()))
	_, port, _ = net.SplitHostPort(open)
	require.NoError(t, testsvc.MasterReady(net.JoinHostPort(p.HostIP, port), host), "--insecure")

	// The admin HTTP port goes through the same decision.
	hl, err := net.Listen("tcp", "0.0.0.0:0")
	require.NoError(t, err)
	hs := netx.ServeHTTP(hl, netx.Config{Allow: auth.Protected.Allow()},
		&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })}, nil)
	defer hs.Close()
	_, hport, _ := net.SplitHostPort(hl.Addr().String())
	resp, err := http.Get("http://127.0.0.1:" + hport + "/")
	require.NoError(t, err)
	resp.Body.Close()
	hc := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: host}}).DialContext}}
	_, err = hc.Get("http://" + net.JoinHostPort(p.HostIP, hport) + "/")
	assert.Error(t, err, "a non-loopback HTTP peer")
	hc.CloseIdleConnections()
}

// TestProtectedDefaultNetns: end to end from another network namespace
// against masters bound to the veth address: the protected default
// refuses the peer, --insecure serves it, and with the cluster token it
// is served once it proves the token.
func TestProtectedDefaultNetns(t *testing.T) {
	p := vethtest.New(t)
	protected := masterOn(t, p.HostIP, service.WithTransportSecurity(nil, nil, auth.Protected.Allow()))
	open := masterOn(t, p.HostIP, service.WithTransportSecurity(nil, nil, auth.Insecure.Allow()))
	tokened := masterOn(t, p.HostIP, service.WithTransportSecurity(nil, testToken, auth.Authenticated.Allow()))
	var errProtected, errOpen, errNoToken, errToken error
	p.Do(t, func() {
		errProtected = testsvc.MasterReady(protected, nil)
		errOpen = testsvc.MasterReady(open, nil)
		errNoToken = testsvc.MasterReady(tokened, nil)
		errToken = testsvc.MasterReady(tokened, nil, crpc.WithToken(testToken))
	})
	assert.Error(t, errProtected, "protected default, peer in another namespace")
	assert.NoError(t, errOpen, "--insecure")
	assert.ErrorIs(t, errNoToken, crpc.ErrTokenRequired)
	assert.NoError(t, errToken, "with the cluster token")
}
