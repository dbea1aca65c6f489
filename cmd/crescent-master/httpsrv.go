package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// httpServers are the master's HTTP ports (admin, metadata), started by
// serve and stopped together by shutdown; with and without HA alike.
type httpServers struct {
	log     *slog.Logger
	sec     *security // nil: as listened
	servers []*http.Server
}

// serve listens on addr and serves h in the background (TLS and the
// protected default from hs.sec).
func (hs *httpServers) serve(addr string, h http.Handler) error {
	return hs.listen(addr, h, true)
}

// serveMetadata is serve for the engines' HTTP metadata server: the
// protected default, no TLS (the engines' metadata client speaks http).
func (hs *httpServers) serveMetadata(addr string, h http.Handler) error {
	return hs.listen(addr, h, false)
}

func (hs *httpServers) listen(addr string, h http.Handler, withTLS bool) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if hs.sec != nil {
		l = hs.sec.listener(l, withTLS)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	hs.servers = append(hs.servers, srv)
	go srv.Serve(l)
	hs.log.Info("http listening", "addr", l.Addr().String())
	return nil
}

// shutdown stops every server, waiting for requests in flight within ctx.
func (hs *httpServers) shutdown(ctx context.Context) {
	for _, s := range hs.servers {
		s.Shutdown(ctx)
	}
}
