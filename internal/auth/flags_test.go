package auth

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func flagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

var allFlags = []Flag{FlagTokenFile, FlagAdminTokenFile, FlagTLS, FlagInsecure}

// Every flag parses into its field; the TLS files come out as TLSFiles.
func TestFlagsParse(t *testing.T) {
	fs := flagSet()
	v := Flags(fs, RoleClient, allFlags...)
	require.Equal(t, FlagValues{}, *v, "defaults are empty")
	require.NoError(t, fs.Parse([]string{"--token_file", "/t", "--admin_token_file", "/a",
		"--tls_cert", "/c", "--tls_key", "/k", "--tls_ca", "/ca"}))
	assert.Equal(t, FlagValues{TokenFile: "/t", AdminTokenFile: "/a", TLSCert: "/c", TLSKey: "/k", TLSCA: "/ca"}, *v)
	assert.Equal(t, TLSFiles{Cert: "/c", Key: "/k", CA: "/ca"}, v.Files())

	fs = flagSet()
	v = Flags(fs, RoleServer, allFlags...)
	require.NoError(t, fs.Parse([]string{"--insecure"}))
	assert.Equal(t, FlagValues{Insecure: true}, *v)
}

// A binary gets only the flags it names; the rest are unknown flags.
func TestFlagsWhich(t *testing.T) {
	fs := flagSet()
	Flags(fs, RoleClient, FlagTokenFile, FlagInsecure)
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	assert.Equal(t, []string{"insecure", "token_file"}, names)
	assert.ErrorContains(t, fs.Parse([]string{"--admin_token_file", "/a"}), "flag provided but not defined: -admin_token_file")
	assert.Panics(t, func() { Flags(flagSet(), RoleClient, Flag{}) }, "the zero Flag")
}

// Register keeps the values already set as defaults (the master's config
// file), and an explicit flag wins over them.
func TestFlagsRegisterDefaults(t *testing.T) {
	v := FlagValues{TokenFile: "/from-file", TLSCA: "/ca"}
	fs := flagSet()
	v.Register(fs, RoleServer, allFlags...)
	assert.Equal(t, "/from-file", fs.Lookup("token_file").DefValue)
	require.NoError(t, fs.Parse([]string{"--token_file", "/flag"}))
	assert.Equal(t, FlagValues{TokenFile: "/flag", TLSCA: "/ca"}, v)
}

// The role picks the wording; For adds what the flag does on this binary
// and replaces a role's default use.
func TestFlagsHelp(t *testing.T) {
	srv, cl := flagSet(), flagSet()
	Flags(srv, RoleServer, allFlags...)
	Flags(cl, RoleClient, FlagTokenFile.For("proves this client"), FlagAdminTokenFile, FlagTLS, FlagInsecure)
	assert.Contains(t, srv.Lookup("tls_ca").Usage, "clients must present a certificate it signed")
	assert.Contains(t, cl.Lookup("tls_ca").Usage, "signed the master's certificate")
	assert.Equal(t, "file (mode 0600) holding the cluster token (the master's --token_file): proves this client", cl.Lookup("token_file").Usage)
	assert.Equal(t, "file (mode 0600) holding the master's admin token", cl.Lookup("admin_token_file").Usage)
	assert.Contains(t, cl.Lookup("insecure").Usage, "without a credential: open this binary's ports")

	fs := flagSet()
	Flags(fs, RoleClient, FlagInsecure.For("talk to the master unauthenticated"))
	assert.Equal(t, "without a credential: talk to the master unauthenticated", fs.Lookup("insecure").Usage)
	assert.Equal(t, Flag{id: insecureFlag}, FlagInsecure, "For returns a copy")
}

// Mode: --insecure with a credential is refused; what a credential is
// depends on the role (a server's --tls_ca demands client certificates, a
// client's --tls_cert is one; a server certificate or a client's CA
// authenticates nobody).
func TestFlagsMode(t *testing.T) {
	for _, tc := range []struct {
		role Role
		args []string
		want Mode
	}{
		{RoleServer, nil, Protected},
		{RoleServer, []string{"--insecure"}, Insecure},
		{RoleServer, []string{"--token_file", "/t"}, Authenticated},
		{RoleServer, []string{"--tls_ca", "/ca"}, Authenticated},
		{RoleServer, []string{"--tls_cert", "/c", "--tls_key", "/k"}, Protected},
		{RoleServer, []string{"--tls_cert", "/c", "--tls_key", "/k", "--insecure"}, Insecure},
		{RoleClient, []string{"--tls_cert", "/c", "--tls_key", "/k"}, Authenticated},
		{RoleClient, []string{"--tls_ca", "/ca", "--insecure"}, Insecure},
		{RoleClient, []string{"--token_file", "/t"}, Authenticated},
	} {
		fs := flagSet()
		v := Flags(fs, tc.role, allFlags...)
		require.NoError(t, fs.Parse(tc.args))
		m, err := v.Mode(tc.role)
		require.NoError(t, err, "%d %v", tc.role, tc.args)
		assert.Equal(t, tc.want, m, "%d %v", tc.role, tc.args)
	}
	for _, tc := range []struct {
		role Role
		args []string
	}{
		{RoleServer, []string{"--insecure", "--token_file", "/t"}},
		{RoleServer, []string{"--insecure", "--tls_ca", "/ca"}},
		{RoleClient, []string{"--insecure", "--token_file", "/t"}},
		{RoleClient, []string{"--insecure", "--tls_cert", "/c"}},
	} {
		fs := flagSet()
		v := Flags(fs, tc.role, allFlags...)
		require.NoError(t, fs.Parse(tc.args))
		_, err := v.Mode(tc.role)
		assert.ErrorIs(t, err, ErrInsecureWithCredential, "%d %v", tc.role, tc.args)
		assert.ErrorContains(t, err, "--insecure together with a credential")
	}
}
