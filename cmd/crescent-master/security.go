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

// securityFlags registers the security flags (auth.FlagValues, the same
// names on every Crescent binary; yaml keys of the same names) on c.
func (c *config) securityFlags(fs *flag.FlagSet) {
	c.FlagValues.Register(fs, auth.RoleServer, auth.FlagTokenFile, auth.FlagAdminTokenFile, auth.FlagTLS, auth.FlagInsecure)
}

// security is the security flags loaded.
type security struct {
	mode         auth.Mode
	token, admin []byte
	tls          *tls.Config
	refused      atomic.Uint64 // HTTP peers turned away
	log          *slog.Logger
}

// loadSecurity reads the files and decides the mode: a credential is the cluster
// token or client certificates (--tls_ca); a server certificate alone
// authenticates nobody.
func loadSecurity(c auth.FlagValues, log *slog.Logger) (*security, error) {
	tok, err := auth.LoadToken(c.TokenFile)
	if err != nil {
		return nil, err
	}
	adm, err := auth.LoadToken(c.AdminTokenFile)
	if err != nil {
		return nil, errors.New("admin " + err.Error())
	}
	tc, err := auth.ServerTLS(c.Files())
	if err != nil {
		return nil, err
	}
	mode, err := c.Mode(auth.RoleServer)
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

// httpAllow is the protected default's decision for an HTTP port
// (netx.Config.Allow), and the refusal hook that logs the first one.
func (s *security) httpAllow() (func(net.Addr) bool, func(net.Addr)) {
	return s.mode.Allow(), func(a net.Addr) {
		if s.refused.Add(1) == 1 {
			s.log.Warn("http: refused a non-loopback peer (protected default; configure a credential or --insecure)", "peer", a.String())
		}
	}
}

// adminHandler guards the admin port's mutating endpoints.
func (s *security) adminHandler(h http.Handler) http.Handler {
	if s.admin == nil && s.mode == auth.Insecure {
		return h
	}
	return admin.RequireAdmin(h, s.admin)
}
