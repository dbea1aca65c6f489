package auth

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
)

// MinTokenBytes is the shortest token LoadToken accepts (128 bits of a
// random token, hex-encoded, is 32).
const MinTokenBytes = 16

// LoadToken reads a token file (see the package doc for what it must be).
// An empty path means no token: nil, nil.
func LoadToken(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("token file %s: not a regular file", path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("token file %s: mode %04o lets group or others read it; chmod 600 it", path, st.Mode().Perm())
	}
	if st.Size() > maxTokenFile {
		return nil, fmt.Errorf("token file %s: %d bytes, more than %d", path, st.Size(), maxTokenFile)
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && st.Size() > 0 {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < MinTokenBytes {
		return nil, fmt.Errorf("token file %s: token is %d bytes, want at least %d", path, len(b), MinTokenBytes)
	}
	return b, nil
}

const maxTokenFile = 4096

// Mode is how a listener treats peers.
type Mode int

const (
	// Protected admits loopback peers only: no credential is configured
	// and --insecure is not set.
	Protected Mode = iota
	// Authenticated admits any peer that proves the credential.
	Authenticated
	// Insecure admits any peer without a credential (--insecure).
	Insecure
)

func (m Mode) String() string {
	switch m {
	case Protected:
		return "protected"
	case Authenticated:
		return "authenticated"
	case Insecure:
		return "insecure"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ErrInsecureWithCredential is returned by Decide when both a credential
// and --insecure are given: the operator must choose.
var ErrInsecureWithCredential = errors.New("--insecure together with a credential: drop one (--insecure turns authentication off)")

// Decide picks the mode from whether a credential is configured and
// whether --insecure was given.
func Decide(credential, insecure bool) (Mode, error) {
	switch {
	case credential && insecure:
		return 0, ErrInsecureWithCredential
	case credential:
		return Authenticated, nil
	case insecure:
		return Insecure, nil
	}
	return Protected, nil
}

// Allow is the netx.Config.Allow filter for the mode: LoopbackOnly in
// Protected mode, nil (everyone) otherwise.
func (m Mode) Allow() func(net.Addr) bool {
	if m == Protected {
		return LoopbackOnly
	}
	return nil
}

// LogLine is the one line a binary logs about its mode.
func (m Mode) LogLine() string {
	switch m {
	case Protected:
		return "no credential configured (--token_file, --tls_cert): accepting loopback peers only; --insecure opens the ports to the network without authentication"
	case Insecure:
		return "--insecure: accepting any peer WITHOUT authentication"
	}
	return "authentication on: every peer must prove the cluster credential"
}

// LoopbackOnly admits peers on a loopback address (127.0.0.0/8, ::1,
// IPv4-mapped loopback) and Unix-socket peers.
func LoopbackOnly(a net.Addr) bool {
	switch v := a.(type) {
	case *net.TCPAddr:
		return v.IP.IsLoopback()
	case *net.UDPAddr:
		return v.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	case nil:
		return false
	}
	h, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return false
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
