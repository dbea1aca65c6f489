package crpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/netx"
)

// versionTokenRequired in a server's preface: this server needs the
// cluster token (the auth challenge) before crpc's preface.
const versionTokenRequired = 0xfe

// ErrTokenRequired is returned by Dial without WithToken when the server
// requires the cluster token.
var ErrTokenRequired = errors.New("crpc: the server requires the cluster token (dial with WithToken; --token_file)")

// authMagic opens an auth.Client hello.
const authMagic = "CRAU"

func tokenRequiredPreface() []byte {
	p := preface()
	p[4] = versionTokenRequired
	return p
}

// WithToken makes every (re)connection prove the cluster token
// (auth.Client, purpose auth.PurposeMasterRPC) after TLS, if any, and
// before crpc's preface.
func WithToken(token []byte) Option {
	return func(c *Conn) { c.token = append([]byte(nil), token...) }
}

// SplitAuth is SplitTLS whose connections must first prove token
// (auth.Server, purpose auth.PurposeMasterRPC, within the preface
// timeout; inside TLS when tc is set) before the split by their next
// bytes. A crpc client without the token is told the port requires it;
// anything else that does not open with the challenge is closed. A nil
// token is SplitTLS.
func SplitAuth(lis net.Listener, cfg netx.Config, tc *tls.Config, token []byte) (crpcL, otherL net.Listener) {
	return split(lis, cfg, tc, append([]byte(nil), token...))
}

// authenticate runs the server side of the challenge on a connection
// whose first four bytes (head) were read already; false: it failed and
// the connection is to be closed.
func authenticate(stream net.Conn, head [4]byte, token []byte) bool {
	if string(head[:]) != authMagic {
		if string(head[:]) == magic {
			stream.SetWriteDeadline(time.Now().Add(prefaceTimeout))
			stream.Write(tokenRequiredPreface())
		}
		return false
	}
	return auth.Server(&replayConn{Conn: stream, head: head[:]}, token, auth.PurposeMasterRPC, prefaceTimeout) == nil
}

// replayConn gives back bytes already read before the rest of Conn.
type replayConn struct {
	net.Conn
	head []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// clientAuth runs the dialler's side of the challenge.
func clientAuth(nc net.Conn, token []byte, addr string) error {
	if err := auth.Client(nc, token, auth.PurposeMasterRPC, prefaceTimeout); err != nil {
		if errors.Is(err, auth.ErrRefused) {
			return fmt.Errorf("crpc: %s: %w", addr, err)
		}
		return fmt.Errorf("crpc: %s: the cluster token challenge failed (does the server use --token_file?): %w", addr, err)
	}
	return nil
}

// TokenCredentials are gRPC client credentials that prove token on
// every connection (as WithToken does for crpc), over inner (TLS
// credentials, or nil for plaintext), for a master served by SplitAuth.
func TokenCredentials(inner credentials.TransportCredentials, token []byte) credentials.TransportCredentials {
	return &tokenCreds{inner: inner, token: append([]byte(nil), token...)}
}

type tokenCreds struct {
	inner credentials.TransportCredentials
	token []byte
}

type plainInfo struct{ credentials.CommonAuthInfo }

func (plainInfo) AuthType() string { return "crescent-token" }

func (t *tokenCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info := raw, credentials.AuthInfo(plainInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.IntegrityOnly}})
	if t.inner != nil {
		var err error
		if conn, info, err = t.inner.ClientHandshake(ctx, authority, raw); err != nil {
			return nil, nil, err
		}
	}
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	err := clientAuth(conn, t.token, authority)
	conn.SetDeadline(time.Time{})
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, info, nil
}

func (t *tokenCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("crpc: token credentials are client-side only (serve with SplitAuth)")
}

func (t *tokenCreds) Info() credentials.ProtocolInfo {
	if t.inner != nil {
		return t.inner.Info()
	}
	return credentials.ProtocolInfo{SecurityProtocol: "crescent-token"}
}

func (t *tokenCreds) Clone() credentials.TransportCredentials {
	c := &tokenCreds{token: t.token}
	if t.inner != nil {
		c.inner = t.inner.Clone()
	}
	return c
}

func (t *tokenCreds) OverrideServerName(string) error { return nil }

// authError is a failed challenge: UNAUTHENTICATED, and errors.Is finds
// auth.ErrRefused in it.
type authError struct{ err error }

func (e *authError) Error() string { return e.err.Error() }
func (e *authError) Unwrap() error { return e.err }
func (e *authError) GRPCStatus() *status.Status {
	return status.New(codes.Unauthenticated, e.err.Error())
}
