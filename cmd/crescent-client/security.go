package main

import (
	"flag"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store"
)

// securityOptions are the security flags every Crescent binary names
// the same (auth.Flags).
type securityOptions struct{ auth.FlagValues }

func registerSecurityFlags(fs *flag.FlagSet, o *securityOptions) {
	o.Register(fs, auth.RoleClient,
		auth.FlagTokenFile.For("proves this client to the master and authenticates every transfer-engine connection (handshake, TCP lanes, shm control)"),
		auth.FlagAdminTokenFile.For("lets this client's local dummies (--local_socket, same uid) do forced removes"),
		auth.FlagTLS,
		auth.FlagInsecure.For("open the metrics port and the transfer engine's ports to any peer WITHOUT authentication (default: loopback peers only; the engine also admits this host's own addresses)"))
}

// mode decides the protected default; a credential is the cluster token
// or a client certificate.
func (o securityOptions) mode() (auth.Mode, error) { return o.Mode(auth.RoleClient) }

// check refuses --insecure with a credential and files that do not load.
func (o securityOptions) check() error {
	if _, err := o.mode(); err != nil {
		return err
	}
	_, err := store.LoadSecurity(o.TokenFile, o.AdminTokenFile, o.Files())
	return err
}

// apply loads the credentials into the store client's config.
func (o securityOptions) apply(cfg *store.Config) error {
	sec, err := store.LoadSecurity(o.TokenFile, o.AdminTokenFile, o.Files())
	if err != nil {
		return err
	}
	cfg.Security = sec
	return nil
}

// serveMetrics serves h on the metrics port through netx's accept loop
// (capped connections, idle ones evicted first, fd exhaustion survived),
// admitting peers as mode allows.
func serveMetrics(lis net.Listener, mode auth.Mode, log *slog.Logger, h http.Handler) *netx.HTTP {
	allow, onRefuse := protect(mode, log)
	cfg := netx.Config{MaxConns: netx.DefaultHTTPMaxConns, MaxConnsPerHost: netx.DefaultHTTPMaxConnsPerHost,
		Name: "metrics port", Logger: log, Allow: allow, OnRefuse: onRefuse}
	return netx.ServeHTTP(lis, cfg, netx.NewHTTPServer(h), nil)
}

// protect is the metrics port's netx.Config.Allow for the mode and the
// refusal hook that logs the first refused peer; it logs the mode once.
func protect(m auth.Mode, log *slog.Logger) (func(net.Addr) bool, func(net.Addr)) {
	log.Info(m.LogLine(), "mode", m.String())
	var refused atomic.Uint64
	return m.Allow(), func(a net.Addr) {
		if refused.Add(1) == 1 {
			log.Warn("metrics port: refused a non-loopback peer (protected default; configure a credential or --insecure)", "peer", a.String())
		}
	}
}
