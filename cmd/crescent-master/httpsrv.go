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

// serve listens on addr and serves h in the background.
func (hs *httpServers) serve(addr string, h http.Handler) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if hs.sec != nil {
		l = hs.sec.listener(l)
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
