package auth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// TLSFiles are the --tls_cert, --tls_key and --tls_ca flags.
type TLSFiles struct {
	Cert, Key string // PEM certificate chain and its key
	CA        string // PEM CA bundle: a server verifies client certificates against it (mTLS), a client the server's
}

// Any reports whether any file is given.
func (f TLSFiles) Any() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

func (f TLSFiles) check(server bool) error {
	if (f.Cert == "") != (f.Key == "") {
		return errors.New("--tls_cert and --tls_key go together")
	}
	if server && f.Cert == "" && f.CA != "" {
		return errors.New("--tls_ca on a server needs --tls_cert and --tls_key (its own certificate)")
	}
	return nil
}

// ServerTLS is a server configuration from f (nil, nil when f is empty):
// f.Cert is the server's certificate and, with f.CA, every client must
// present a certificate that CA signed. The files are read again, at the
// next handshake, once any of them changes (size, modification time), so
// certificates are replaced without a restart; a change that does not
// load (a half-written file) keeps the last good ones and is reported by
// the next Reload. At least TLS 1.2.
func ServerTLS(f TLSFiles) (*tls.Config, error) {
	if !f.Any() {
		return nil, nil
	}
	if err := f.check(true); err != nil {
		return nil, err
	}
	r := &reloader{files: f}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			_ = r.Reload()
			return r.config(), nil
		},
	}, nil
}

// ClientTLS is a client configuration from f (nil, nil when f is empty):
// with f.CA the server's certificate must be signed by it (else the
// system roots), and f.Cert/f.Key are presented to a server that asks.
func ClientTLS(f TLSFiles) (*tls.Config, error) {
	if !f.Any() {
		return nil, nil
	}
	if err := f.check(false); err != nil {
		return nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.Cert != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if f.CA != "" {
		pool, err := loadPool(f.CA)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	return c, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tls ca %s: no PEM certificate in it", path)
	}
	return pool, nil
}

type stamp struct {
	size int64
	mod  time.Time
}

type reloader struct {
	files TLSFiles
	mu    sync.Mutex
	seen  [3]stamp
	cur   *tls.Config
}

func (r *reloader) config() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// Reload reads the files again if any changed since the last load.
func (r *reloader) Reload() error {
	var now [3]stamp
	for i, p := range []string{r.files.Cert, r.files.Key, r.files.CA} {
		if p == "" {
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		now[i] = stamp{st.Size(), st.ModTime()}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && now == r.seen {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(r.files.Cert, r.files.Key)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if r.files.CA != "" {
		pool, err := loadPool(r.files.CA)
		if err != nil {
			return err
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	r.cur, r.seen = c, now
	return nil
}
