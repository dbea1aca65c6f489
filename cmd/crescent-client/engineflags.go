package main

import (
	"flag"

	"github.com/crescent-kv/crescent/internal/auth"
)

// engineSecurity is the transfer engine's credential settings. The
// cluster token and --insecure are the flags the master connection uses
// too (securityOptions, registered once); --mooncake_compat is the
// engine's own. The store client starts the engine with them
// (store.Config.EngineInsecure, MooncakeCompat; the token from Security).
type engineSecurity struct {
	sec            *securityOptions
	mooncakeCompat bool
	insecure       bool
	token          []byte // loaded by check
}

func registerEngineFlags(fs *flag.FlagSet, s *engineSecurity, sec *securityOptions) {
	s.sec = sec
	fs.BoolVar(&s.mooncakeCompat, "mooncake_compat", false, "serve Mooncake peers, which cannot authenticate: the transfer engine's ports open to any address without authentication; refused with --token_file")
}

// check loads the token and refuses contradictory flags.
func (s *engineSecurity) check() error {
	s.insecure = s.sec.Insecure
	tok, err := auth.LoadToken(s.sec.TokenFile)
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

// set reports whether any engine credential setting is given.
func (s *engineSecurity) set() bool { return s.token != nil || s.insecure || s.mooncakeCompat }
