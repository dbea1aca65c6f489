package ctl

import (
	"flag"
	"net/http"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/store"
)

// securityFlags are the security flags every Crescent binary names the
// same (auth.Flags).
type securityFlags struct{ auth.FlagValues }

func (s *securityFlags) bind(fs *flag.FlagSet) {
	s.Register(fs, auth.RoleClient, auth.FlagTokenFile,
		auth.FlagAdminTokenFile.For("rm --force, rm --regex"),
		auth.FlagTLS,
		auth.FlagInsecure.For("talk to the master unauthenticated (refused together with one)"))
}

// check refuses --insecure with a credential, as the servers do; any
// --tls_* flag counts as one here (it is all TLS to the master).
func (s *securityFlags) check() error {
	_, err := auth.Decide(s.TokenFile != "" || s.Files().Any(), s.Insecure)
	if err != nil {
		return usagef("%v", err)
	}
	return nil
}

// load is the store client's security.
func (s *securityFlags) load() (store.Security, error) {
	sec, err := store.LoadSecurity(s.TokenFile, s.AdminTokenFile, s.Files())
	if err != nil {
		return sec, usagef("%v", err)
	}
	return sec, nil
}

// adminHTTP is the client of the admin port: https with the TLS flags.
func (s *securityFlags) adminHTTP() (*http.Client, string, error) {
	tc, err := auth.ClientTLS(s.Files())
	if err != nil {
		return nil, "", usagef("%v", err)
	}
	if tc == nil {
		return http.DefaultClient, "http://", nil
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}, "https://", nil
}
