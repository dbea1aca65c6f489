package main

import (
	"flag"
	"fmt"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/store"
)

// engineSecurity is the transfer engine's credential settings. The
// cluster token and --insecure are the flags the master connection uses
// too (securityOptions, registered once); --mooncake_compat is the
// engine's own.
type engineSecurity struct {
	sec            *securityOptions
	mooncakeCompat bool
	token          []byte // loaded by check
	insecure       bool
}

func registerEngineFlags(fs *flag.FlagSet, s *engineSecurity, sec *securityOptions) {
	s.sec = sec
	fs.BoolVar(&s.mooncakeCompat, "mooncake_compat", false, "serve Mooncake peers, which cannot authenticate: the transfer engine's ports open to any address without authentication; refused with --token_file")
}

// check loads the token and refuses contradictory flags.
func (s *engineSecurity) check() error {
	s.insecure = s.sec.insecure
	tok, err := auth.LoadToken(s.sec.tokenFile)
	if err != nil {
		return usagef("--token_file: %w", err)
	}
	switch {
	case tok != nil && s.mooncakeCompat:
		return usagef("--mooncake_compat together with --token_file: Mooncake peers cannot authenticate; drop one")
	case tok != nil && s.insecure:
		return usagef("%v", auth.ErrInsecureWithCredential)
	}
	s.token = tok
	return nil
}

func (s *engineSecurity) set() bool { return s.token != nil || s.insecure || s.mooncakeCompat }

// startEngine starts the engine the store client would, with the
// credential settings; nil when none is set (the client starts its own,
// in the protected default).
func startEngine(cfg store.Config, s *engineSecurity) (*engine.Engine, error) {
	if !s.set() {
		return nil, nil
	}
	e, err := engine.New(engine.Config{
		LocalServerName: cfg.LocalHostname, MetadataServer: cfg.MetadataServer,
		Protocols: cfg.Protocols, Logger: cfg.Logger, Notifications: engine.NotifyOff,
		Token: s.token, Insecure: s.insecure, MooncakeCompat: s.mooncakeCompat,
	})
	if err != nil {
		return nil, fmt.Errorf("start transfer engine: %w", err)
	}
	return e, nil
}
