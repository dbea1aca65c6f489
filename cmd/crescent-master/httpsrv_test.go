package main

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/crescent-kv/crescent/engine/metadata/httpmeta"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/internal/testsvc"
)

// The master's HTTP ports (admin and HTTP metadata) cap connections per
// peer host, closing the keep-alive connection idle longest for a new
// one, and serve a peer that connected while the process had no fd left.
func TestHTTPPortsBounded(t *testing.T) {
	c := defaults()
	c.RPCAddress, c.HTTPMetadataServerHost = "127.0.0.1", "127.0.0.1"
	c.RPCPort, c.MetricsPort, c.HTTPMetadataServerPort = testsvc.FreePort(t), testsvc.FreePort(t), testsvc.FreePort(t)
	c.EnableHTTPMetadataServer = true
	c.LogLevel = "error"
	_, stop := startRun(t, c)
	defer func() { assert.NoError(t, stop()) }()
	t.Run("admin", func(t *testing.T) {
		testsvc.CheckHTTPPortBounded(t, "127.0.0.1:"+strconv.Itoa(c.MetricsPort), "/health", netx.DefaultHTTPMaxConnsPerHost)
	})
	t.Run("metadata", func(t *testing.T) {
		testsvc.CheckHTTPPortBounded(t, "127.0.0.1:"+strconv.Itoa(c.HTTPMetadataServerPort), "/health", httpmeta.DefaultMaxConnsPerHost)
	})
}
