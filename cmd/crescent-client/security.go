package main

import (
	"flag"
	"log/slog"
	"net"
	"sync/atomic"

	"github.com/crescent-kv/crescent/internal/auth"
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

// protect filters the metrics listener by the mode, logging the mode once
// and the first refused peer.
func protect(l net.Listener, m auth.Mode, log *slog.Logger) net.Listener {
	log.Info(m.LogLine(), "mode", m.String())
	var refused atomic.Uint64
	return auth.Filter(l, m.Allow(), func(a net.Addr) {
		if refused.Add(1) == 1 {
			log.Warn("metrics port: refused a non-loopback peer (protected default; configure a credential or --insecure)", "peer", a.String())
		}
	})
}
