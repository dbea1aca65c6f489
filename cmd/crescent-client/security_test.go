package main

import (
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/internal/vethtest"
)

// TestMetricsPortProtected: the metrics port of a client without a
// credential serves loopback peers and refuses one on the host's
// non-loopback (veth) address; --insecure serves it.
func TestMetricsPortProtected(t *testing.T) {
	p := vethtest.New(t)
	for _, m := range []auth.Mode{auth.Protected, auth.Insecure} {
		lis, err := net.Listen("tcp", "0.0.0.0:0")
		require.NoError(t, err)
		srv := serveMetrics(lis, m, slog.New(slog.DiscardHandler),
			http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("OK")) }))
		_, port, _ := net.SplitHostPort(lis.Addr().String())
		get := func(host string) error {
			hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
				DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(host)}}).DialContext}}
			defer hc.CloseIdleConnections()
			resp, err := hc.Get("http://" + net.JoinHostPort(host, port) + "/health")
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		assert.NoError(t, get("127.0.0.1"), m.String())
		if m == auth.Protected {
			assert.Error(t, get(p.HostIP), "protected: a non-loopback peer")
		} else {
			assert.NoError(t, get(p.HostIP), "insecure")
		}
		srv.Close()
	}
}

// The metrics port caps connections per peer host (the idle longest
// makes room) and survives fd exhaustion.
func TestMetricsPortBounded(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := serveMetrics(lis, auth.Protected, slog.New(slog.DiscardHandler),
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("OK")) }))
	defer srv.Close()
	testsvc.CheckHTTPPortBounded(t, lis.Addr().String(), "/health", netx.DefaultHTTPMaxConnsPerHost)
}
