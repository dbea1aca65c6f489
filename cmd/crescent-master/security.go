package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/store/master/admin"
	"github.com/crescent-kv/crescent/store/master/service"
)

// securityConfig is how the master authenticates peers and admins (the
// same flag names on every Crescent binary).
type securityConfig struct {
	TokenFile      string `yaml:"token_file"`
	AdminTokenFile string `yaml:"admin_token_file"`
	TLSCert        string `yaml:"tls_cert"`
	TLSKey         string `yaml:"tls_key"`
	TLSCA          string `yaml:"tls_ca"`
	Insecure       bool   `yaml:"insecure"`
}

func (c *securityConfig) securityFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.TokenFile, "token_file", c.TokenFile, "file (mode 0600) holding the cluster token: every RPC connection must prove it (the alternative to mTLS)")
	fs.StringVar(&c.AdminTokenFile, "admin_token_file", c.AdminTokenFile, "file (mode 0600) holding the admin token that RemoveAll, RemoveByRegex, forced removes and the admin HTTP POST endpoints need; without it they are refused (unless --insecure)")
	fs.StringVar(&c.TLSCert, "tls_cert", c.TLSCert, "PEM certificate of the RPC and admin ports (TLS; the files are re-read when they change)")
	fs.StringVar(&c.TLSKey, "tls_key", c.TLSKey, "PEM key of --tls_cert")
	fs.StringVar(&c.TLSCA, "tls_ca", c.TLSCA, "PEM CA: clients must present a certificate it signed (mTLS)")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "accept any peer WITHOUT authentication (default without --token_file or --tls_ca: loopback peers only)")
}

// security is securityConfig loaded.
type security struct {
	mode         auth.Mode
	token, admin []byte
	tls          *tls.Config
	refused      atomic.Uint64 // HTTP peers turned away
	log          *slog.Logger
}

// load reads the files and decides the mode: a credential is the cluster
// token or client certificates (--tls_ca); a server certificate alone
// authenticates nobody.
func (c securityConfig) load(log *slog.Logger) (*security, error) {
	tok, err := auth.LoadToken(c.TokenFile)
	if err != nil {
		return nil, err
	}
	adm, err := auth.LoadToken(c.AdminTokenFile)
	if err != nil {
		return nil, errors.New("admin " + err.Error())
	}
	tc, err := auth.ServerTLS(auth.TLSFiles{Cert: c.TLSCert, Key: c.TLSKey, CA: c.TLSCA})
	if err != nil {
		return nil, err
	}
	mode, err := auth.Decide(tok != nil || c.TLSCA != "", c.Insecure)
	if err != nil {
		return nil, err
	}
	return &security{mode: mode, token: tok, admin: adm, tls: tc, log: log}, nil
}

// logLine says once how peers are treated.
func (s *security) logLine() {
	s.log.Info(s.mode.LogLine(), "mode", s.mode.String(), "tls", s.tls != nil, "cluster_token", s.token != nil, "admin_token", s.admin != nil)
}

// serviceOptions secure the RPC port.
func (s *security) serviceOptions() []service.Option {
	opts := []service.Option{service.WithTransportSecurity(s.tls, s.token, s.mode.Allow())}
	if s.admin != nil || s.mode != auth.Insecure {
		opts = append(opts, service.WithAdminToken(s.admin))
	}
	return opts
}

// listener secures an HTTP port: the protected default's filter, then
// TLS (withTLS).
func (s *security) listener(l net.Listener, withTLS bool) net.Listener {
	l = auth.Filter(l, s.mode.Allow(), func(a net.Addr) {
		if s.refused.Add(1) == 1 {
			s.log.Warn("http: refused a non-loopback peer (protected default; configure a credential or --insecure)", "peer", a.String())
		}
	})
	if s.tls != nil && withTLS {
		l = tls.NewListener(l, s.tls)
	}
	return l
}

// adminHandler guards the admin port's mutating endpoints.
func (s *security) adminHandler(h http.Handler) http.Handler {
	if s.admin == nil && s.mode == auth.Insecure {
		return h
	}
	return admin.RequireAdmin(h, s.admin)
}
