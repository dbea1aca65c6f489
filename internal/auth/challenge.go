package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Purpose binds a challenge to one kind of connection.
type Purpose byte

const (
	PurposeHandshake  Purpose = 1 // the engine's P2P handshake
	PurposeTCPLane    Purpose = 2 // a TCP transport data lane
	PurposeShmControl Purpose = 3 // the shm transport's control socket
	PurposeMasterRPC  Purpose = 4 // a store client's RPC connection to the master
	PurposeLocal      Purpose = 5 // a dummy client's local socket
)

// DefaultTimeout bounds a whole exchange.
const DefaultTimeout = 5 * time.Second

const (
	version   = 1
	nonceLen  = 32
	macLen    = sha256.Size
	helloLen  = 4 + 1 + 1 + nonceLen
	answerLen = helloLen + macLen
)

var magic = [4]byte{'C', 'R', 'A', 'U'}

// ErrRefused means the peer failed (or, for Client, refused) the challenge.
var ErrRefused = errors.New("auth: peer failed authentication")

func mac(token []byte, label string, p Purpose, a, b []byte) []byte {
	h := hmac.New(sha256.New, token)
	h.Write([]byte(label))
	h.Write([]byte{byte(p)})
	h.Write(a)
	h.Write(b)
	return h.Sum(nil)
}

func deadline(c net.Conn, timeout time.Duration) func() {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	return func() { _ = c.SetDeadline(time.Time{}) }
}

func header(p Purpose, nonce []byte) []byte {
	b := make([]byte, 0, answerLen)
	b = append(b, magic[:]...)
	b = append(b, version, byte(p))
	return append(b, nonce...)
}

func checkHeader(b []byte, p Purpose) error {
	if [4]byte(b[:4]) != magic {
		return fmt.Errorf("%w: not a Crescent authentication hello", ErrRefused)
	}
	if b[4] != version {
		return fmt.Errorf("%w: challenge version %d, want %d", ErrRefused, b[4], version)
	}
	if Purpose(b[5]) != p {
		return fmt.Errorf("%w: challenge for purpose %d on a purpose %d connection", ErrRefused, b[5], p)
	}
	return nil
}

// Client runs the dialler's side on a fresh connection. On success the
// connection carries the protocol's frames as if nothing had happened.
func Client(c net.Conn, token []byte, p Purpose, timeout time.Duration) error {
	defer deadline(c, timeout)()
	nc := make([]byte, nonceLen)
	if _, err := rand.Read(nc); err != nil {
		return err
	}
	if _, err := c.Write(header(p, nc)); err != nil {
		return fmt.Errorf("auth: send hello: %w", err)
	}
	ans := make([]byte, answerLen)
	if _, err := io.ReadFull(c, ans); err != nil {
		return fmt.Errorf("auth: read answer: %w", err)
	}
	if err := checkHeader(ans, p); err != nil {
		return err
	}
	ns := ans[helloLen-nonceLen : helloLen]
	if !hmac.Equal(ans[helloLen:], mac(token, "crescent-auth-v1 server", p, nc, ns)) {
		return fmt.Errorf("%w: the server does not hold the cluster token", ErrRefused)
	}
	if _, err := c.Write(mac(token, "crescent-auth-v1 client", p, ns, nc)); err != nil {
		return fmt.Errorf("auth: send proof: %w", err)
	}
	var v [1]byte
	if _, err := io.ReadFull(c, v[:]); err != nil {
		return fmt.Errorf("auth: read verdict: %w", err)
	}
	if v[0] != 0 {
		return fmt.Errorf("%w: the server refused this client's token", ErrRefused)
	}
	return nil
}

// Server runs the acceptor's side. On an error the caller closes the
// connection without serving anything.
func Server(c net.Conn, token []byte, p Purpose, timeout time.Duration) error {
	defer deadline(c, timeout)()
	hello := make([]byte, helloLen)
	if _, err := io.ReadFull(c, hello); err != nil {
		return fmt.Errorf("auth: read hello: %w", err)
	}
	if err := checkHeader(hello, p); err != nil {
		return err
	}
	nc := hello[helloLen-nonceLen:]
	ns := make([]byte, nonceLen)
	if _, err := rand.Read(ns); err != nil {
		return err
	}
	ans := append(header(p, ns), mac(token, "crescent-auth-v1 server", p, nc, ns)...)
	if _, err := c.Write(ans); err != nil {
		return fmt.Errorf("auth: send answer: %w", err)
	}
	proof := make([]byte, macLen)
	if _, err := io.ReadFull(c, proof); err != nil {
		return fmt.Errorf("auth: read proof: %w", err)
	}
	if !hmac.Equal(proof, mac(token, "crescent-auth-v1 client", p, ns, nc)) {
		_, _ = c.Write([]byte{1})
		return fmt.Errorf("%w: wrong token from %s", ErrRefused, c.RemoteAddr())
	}
	if _, err := c.Write([]byte{0}); err != nil {
		return fmt.Errorf("auth: send verdict: %w", err)
	}
	return nil
}
