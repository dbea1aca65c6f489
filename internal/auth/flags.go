package auth

import "flag"

// FlagValues are the security flags every Crescent binary names the same.
// Their yaml tags are the keys of the master's config file.
type FlagValues struct {
	TokenFile      string `yaml:"token_file"`
	AdminTokenFile string `yaml:"admin_token_file"`
	TLSCert        string `yaml:"tls_cert"`
	TLSKey         string `yaml:"tls_key"`
	TLSCA          string `yaml:"tls_ca"`
	Insecure       bool   `yaml:"insecure"`
}

// Role is which side of a master connection a binary is: it picks the
// wording of the help texts and what counts as a credential (Mode).
type Role int

const (
	// RoleServer is the master: its ports demand the credential.
	RoleServer Role = iota
	// RoleClient talks to a master or to other engines with it.
	RoleClient
)

// A Flag selects security flags for Flags: FlagTokenFile,
// FlagAdminTokenFile, FlagTLS (--tls_cert, --tls_key and --tls_ca) or
// FlagInsecure; Register panics on any other (a programming error).
type Flag struct {
	id  flagID
	use string
}

type flagID int

const (
	noFlag flagID = iota
	tokenFlag
	adminFlag
	tlsFlag
	insecureFlag
)

// The flags a binary may choose. For returns a copy; they stay as they are.
var (
	FlagTokenFile      = Flag{id: tokenFlag}
	FlagAdminTokenFile = Flag{id: adminFlag}
	FlagTLS            = Flag{id: tlsFlag}
	FlagInsecure       = Flag{id: insecureFlag}
)

// For says what the flag does on this binary: its help text is the
// role's, then ": " and use (replacing the role's default use, if any).
// It does not apply to FlagTLS.
func (f Flag) For(use string) Flag {
	f.use = use
	return f
}

// help is the shared wording of each flag, by role.
var help = [2]map[string]string{
	RoleServer: {
		"token_file":       "file (mode 0600) holding the cluster token: every RPC connection must prove it (the alternative to mTLS)",
		"admin_token_file": "file (mode 0600) holding the admin token that RemoveAll, RemoveByRegex, forced removes and the admin HTTP POST endpoints need; without it they are refused (unless --insecure)",
		"tls_cert":         "PEM certificate of the RPC and admin ports (TLS; the files are re-read when they change)",
		"tls_key":          "PEM key of --tls_cert",
		"tls_ca":           "PEM CA: clients must present a certificate it signed (mTLS)",
		"insecure":         "accept any peer WITHOUT authentication (default without --token_file or --tls_ca: loopback peers only)",
	},
	RoleClient: {
		"token_file":       "file (mode 0600) holding the cluster token (the master's --token_file)",
		"admin_token_file": "file (mode 0600) holding the master's admin token",
		"tls_cert":         "PEM client certificate, for a master that verifies clients (mTLS)",
		"tls_key":          "PEM key of --tls_cert",
		"tls_ca":           "PEM CA that signed the master's certificate; any --tls_* flag turns TLS to the master on",
		"insecure":         "without a credential",
	},
}

// defaultUse completes a help text a binary gives no use for.
var defaultUse = [2]map[string]string{
	RoleClient: {"insecure": "open this binary's ports to any peer WITHOUT authentication (default: loopback peers only)"},
}

// Flags registers the flags of which on fs (the role's wording, empty
// defaults), bound to the returned values. A binary names only the flags
// it uses.
func Flags(fs *flag.FlagSet, r Role, which ...Flag) *FlagValues {
	v := &FlagValues{}
	v.Register(fs, r, which...)
	return v
}

// Register binds the flags of which to v, with v's current values as
// defaults (the master's config file sets them before its flags are
// parsed again).
func (v *FlagValues) Register(fs *flag.FlagSet, r Role, which ...Flag) {
	if r != RoleServer && r != RoleClient {
		panic("auth: unknown Role")
	}
	text := func(name, use string) string {
		if use == "" {
			use = defaultUse[r][name]
		}
		if use == "" {
			return help[r][name]
		}
		return help[r][name] + ": " + use
	}
	for _, f := range which {
		switch f.id {
		case tokenFlag:
			fs.StringVar(&v.TokenFile, "token_file", v.TokenFile, text("token_file", f.use))
		case adminFlag:
			fs.StringVar(&v.AdminTokenFile, "admin_token_file", v.AdminTokenFile, text("admin_token_file", f.use))
		case tlsFlag:
			fs.StringVar(&v.TLSCert, "tls_cert", v.TLSCert, text("tls_cert", ""))
			fs.StringVar(&v.TLSKey, "tls_key", v.TLSKey, text("tls_key", ""))
			fs.StringVar(&v.TLSCA, "tls_ca", v.TLSCA, text("tls_ca", ""))
		case insecureFlag:
			fs.BoolVar(&v.Insecure, "insecure", v.Insecure, text("insecure", f.use))
		default:
			panic("auth: Flags: unknown Flag")
		}
	}
}

// Files are the --tls_* flags.
func (v *FlagValues) Files() TLSFiles {
	return TLSFiles{Cert: v.TLSCert, Key: v.TLSKey, CA: v.TLSCA}
}

// Mode decides the protected default from the flags (Decide): a
// credential is the cluster token or, on a RoleServer, --tls_ca (client
// certificates required), on a RoleClient its own --tls_cert. A server
// certificate alone authenticates nobody. --insecure with a credential is
// ErrInsecureWithCredential.
func (v *FlagValues) Mode(r Role) (Mode, error) {
	cred := v.TokenFile != ""
	if r == RoleServer {
		cred = cred || v.TLSCA != ""
	} else {
		cred = cred || v.TLSCert != ""
	}
	return Decide(cred, v.Insecure)
}
