package main

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"

	"github.com/crescent-kv/crescent/engine/metadata/httpmeta"
	"github.com/crescent-kv/crescent/internal/netx"
)

// httpServers are the master's HTTP ports (admin, metadata), started by
// serve and stopped together by shutdown; with and without HA alike.
// Each serves through netx's accept loop: capped connections in all and
// per peer host, idle ones evicted first, fd exhaustion survived.
type httpServers struct {
	log     *slog.Logger
	sec     *security // nil: as listened
	servers []*netx.HTTP
}

// serve listens on addr and serves h in the background (TLS and the
// protected default from hs.sec).
func (hs *httpServers) serve(addr string, h http.Handler) error {
	return hs.listen(addr, h, true, netx.Config{Name: "admin port",
		MaxConns: netx.DefaultHTTPMaxConns, MaxConnsPerHost: netx.DefaultHTTPMaxConnsPerHost})
}

// serveMetadata is serve for the engines' HTTP metadata server: the
// protected default, no TLS (the engines' metadata client speaks http).
func (hs *httpServers) serveMetadata(addr string, h http.Handler) error {
	return hs.listen(addr, h, false, netx.Config{Name: "http metadata port",
		MaxConns: httpmeta.DefaultMaxConns, MaxConnsPerHost: httpmeta.DefaultMaxConnsPerHost})
}

func (hs *httpServers) listen(addr string, h http.Handler, withTLS bool, cfg netx.Config) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	cfg.Logger = hs.log
	var tc *tls.Config
	if hs.sec != nil {
		cfg.Allow, cfg.OnRefuse = hs.sec.httpAllow()
		if withTLS {
			tc = hs.sec.tls
		}
	}
	hs.servers = append(hs.servers, netx.ServeHTTP(l, cfg, netx.NewHTTPServer(h), tc))
	hs.log.Info("http listening", "addr", l.Addr().String())
	return nil
}

// shutdown stops every server, waiting for requests in flight within ctx.
func (hs *httpServers) shutdown(ctx context.Context) {
	for _, s := range hs.servers {
		s.Shutdown(ctx)
	}
}
