package ctl

import (
	"flag"
	"net/http"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/store"
)

// securityFlags are the flags every Crescent binary names the same.
type securityFlags struct {
	tokenFile, adminTokenFile string
	tlsCert, tlsKey, tlsCA    string
	insecure                  bool
}

func (s *securityFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&s.tokenFile, "token_file", "", "file (mode 0600) holding the cluster token (the master's --token_file)")
	fs.StringVar(&s.adminTokenFile, "admin_token_file", "", "file (mode 0600) holding the master's admin token: rm --force, rm --regex")
	fs.StringVar(&s.tlsCert, "tls_cert", "", "PEM client certificate, for a master that verifies clients (mTLS)")
	fs.StringVar(&s.tlsKey, "tls_key", "", "PEM key of --tls_cert")
	fs.StringVar(&s.tlsCA, "tls_ca", "", "PEM CA that signed the master's certificate; any --tls_* flag turns TLS on (RPC and admin ports)")
	fs.BoolVar(&s.insecure, "insecure", false, "talk to the master without a credential (refused together with one)")
}

func (s *securityFlags) files() auth.TLSFiles {
	return auth.TLSFiles{Cert: s.tlsCert, Key: s.tlsKey, CA: s.tlsCA}
}

// check refuses --insecure with a credential, as the servers do.
func (s *securityFlags) check() error {
	_, err := auth.Decide(s.tokenFile != "" || s.files().Any(), s.insecure)
	if err != nil {
		return usagef("%v", err)
	}
	return nil
}

// load is the store client's security.
func (s *securityFlags) load() (store.Security, error) {
	sec, err := store.LoadSecurity(s.tokenFile, s.adminTokenFile, s.files())
	if err != nil {
		return sec, usagef("%v", err)
	}
	return sec, nil
}

// adminHTTP is the client of the admin port: https with the TLS flags.
func (s *securityFlags) adminHTTP() (*http.Client, string, error) {
	tc, err := auth.ClientTLS(s.files())
	if err != nil {
		return nil, "", usagef("%v", err)
	}
	if tc == nil {
		return http.DefaultClient, "http://", nil
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}, "https://", nil
}
