package store

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/crpc"
)

// Security is how connections to the master authenticate: the cluster
// token (the master's --token_file) and TLS (the master's --tls_*). The
// zero value is plaintext without a token.
type Security struct {
	Token []byte      // proved once per connection (auth challenge), never sent
	TLS   *tls.Config // nil: plaintext
	// Admin is the master's admin token (--admin_token_file), sent on
	// admin calls: RemoveAll, RemoveByRegex, forced removes.
	Admin []byte
	// pollWait is Config.MasterPollWait, for every crpc connection the
	// client opens (first and failover dials alike).
	pollWait time.Duration
}

// LoadSecurity reads the token files and TLS files (the --token_file,
// --admin_token_file and --tls_ca/--tls_cert/--tls_key flags; empty: not
// used).
func LoadSecurity(tokenFile, adminTokenFile string, files auth.TLSFiles) (Security, error) {
	tok, err := auth.LoadToken(tokenFile)
	if err != nil {
		return Security{}, err
	}
	adm, err := auth.LoadToken(adminTokenFile)
	if err != nil {
		return Security{}, fmt.Errorf("admin %w", err)
	}
	tc, err := auth.ClientTLS(files)
	if err != nil {
		return Security{}, err
	}
	return Security{Token: tok, TLS: tc, Admin: adm}, nil
}

func (s Security) crpcOptions() []crpc.Option {
	var opts []crpc.Option
	if s.TLS != nil {
		opts = append(opts, crpc.WithTLS(s.TLS))
	}
	if s.Token != nil {
		opts = append(opts, crpc.WithToken(s.Token))
	}
	if s.pollWait > 0 {
		opts = append(opts, crpc.WithPollWait(s.pollWait))
	}
	return opts
}

func (s Security) grpcCredentials() credentials.TransportCredentials {
	var c credentials.TransportCredentials
	if s.TLS != nil {
		c = credentials.NewTLS(s.TLS)
	}
	if s.Token != nil {
		return crpc.TokenCredentials(c, s.Token)
	}
	if c == nil {
		c = insecure.NewCredentials()
	}
	return c
}

// refusedForGood: the master turned this client's security down (no
// token, a wrong one, TLS needed); dialling again will not help.
func refusedForGood(err error) bool {
	return errors.Is(err, crpc.ErrTLSRequired) || errors.Is(err, crpc.ErrTokenRequired) || errors.Is(err, auth.ErrRefused)
}

// adminToken is what an admin call carries: the admin token when the
// call needs it (a forced remove), else nothing.
func (c *Client) adminToken(needed bool) []byte {
	if !needed {
		return nil
	}
	return c.cfg.Security.Admin
}
