package main

import (
	"flag"
	"log/slog"
	"net"
	"sync/atomic"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/store"
)

// securityOptions are the flags every Crescent binary names the same.
type securityOptions struct {
	tokenFile              string
	adminTokenFile         string
	tlsCert, tlsKey, tlsCA string
	insecure               bool
}

func registerSecurityFlags(fs *flag.FlagSet, o *securityOptions) {
	fs.StringVar(&o.tokenFile, "token_file", "", "file (mode 0600) holding the cluster token (the master's --token_file): proves this client to the master and authenticates every transfer-engine connection (handshake, TCP lanes, shm control)")
	fs.StringVar(&o.adminTokenFile, "admin_token_file", "", "file (mode 0600) holding the master's admin token: lets this client's local dummies (--local_socket, same uid) do forced removes")
	fs.StringVar(&o.tlsCert, "tls_cert", "", "PEM client certificate for a master that verifies clients (mTLS)")
	fs.StringVar(&o.tlsKey, "tls_key", "", "PEM key of --tls_cert")
	fs.StringVar(&o.tlsCA, "tls_ca", "", "PEM CA that signed the master's certificate; any --tls_* flag turns TLS to the master on")
	fs.BoolVar(&o.insecure, "insecure", false, "without a credential: open the metrics port and the transfer engine's ports to any peer WITHOUT authentication (default: loopback peers only; the engine also admits this host's own addresses)")
}

func (o securityOptions) files() auth.TLSFiles {
	return auth.TLSFiles{Cert: o.tlsCert, Key: o.tlsKey, CA: o.tlsCA}
}

// mode decides the protected default; a credential is the cluster token
// or a client certificate.
func (o securityOptions) mode() (auth.Mode, error) {
	return auth.Decide(o.tokenFile != "" || o.tlsCert != "", o.insecure)
}

// check refuses --insecure with a credential and files that do not load.
func (o securityOptions) check() error {
	if _, err := o.mode(); err != nil {
		return err
	}
	_, err := store.LoadSecurity(o.tokenFile, o.adminTokenFile, o.files())
	return err
}

// apply loads the credentials into the store client's config.
func (o securityOptions) apply(cfg *store.Config) error {
	sec, err := store.LoadSecurity(o.tokenFile, o.adminTokenFile, o.files())
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
