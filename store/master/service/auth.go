package service

import (
	"crypto/tls"
	"net"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// WithAdminToken makes the admin RPCs (RemoveAll, RemoveByRegex, and
// Remove and BatchRemove with force) need token in their admin_token
// field. A nil token refuses them all (a master whose operator configured
// no admin credential and did not choose --insecure). Without this
// option they are open (a library user's in-process master).
func WithAdminToken(token []byte) Option {
	return func(s *Service) {
		s.admin = append([]byte(nil), token...)
		s.adminSet = true
	}
}

// bound is a request acting as a client: its session must prove its id.
type bound interface {
	GetClientId() *storepb.UUID
	GetSession() []byte
}

type forced interface {
	GetForce() bool
	GetAdminToken() []byte
}

// authorize is the interceptor's check, before the handler runs: a call
// acting as a client must carry the session its id is derived from
// (auth.ClientID), and an admin call the admin credential. Both are
// ILLEGAL_CLIENT otherwise.
func (s *Service) authorize(rpc int, req any) error {
	if b, ok := req.(bound); ok {
		id := b.GetClientId()
		if id == nil {
			return rpcerr.ToStatus(errcode.New(errcode.InvalidParams, "client_id missing"))
		}
		if err := auth.CheckSession(b.GetSession(), id.High, id.Low); err != nil {
			return rpcerr.ToStatus(errcode.New(errcode.IllegalClient, "client %016x-%016x: %v", id.High, id.Low, err))
		}
	}
	if !s.adminSet {
		return nil
	}
	var tok []byte
	switch rpc {
	case rpcRemoveAll, rpcRemoveByRegex:
		tok = req.(forced).GetAdminToken()
	case rpcRemove, rpcBatchRemove:
		f := req.(forced)
		if !f.GetForce() {
			return nil
		}
		tok = f.GetAdminToken()
	default:
		return nil
	}
	if len(s.admin) == 0 {
		return rpcerr.ToStatus(errcode.New(errcode.IllegalClient, "%s is an admin operation and this master has no admin credential (--admin_token_file)", rpcNames[rpc]))
	}
	if !auth.Equal(tok, s.admin) {
		return rpcerr.ToStatus(errcode.New(errcode.IllegalClient, "%s needs the admin credential (--admin_token_file)", rpcNames[rpc]))
	}
	return nil
}

// WithTransportSecurity secures Serve's port: TLS with tc (nil:
// plaintext; overrides WithCRPC's TLS), every connection proving the
// cluster token first (nil: none; crpc.SplitAuth), and allow turning
// peers away by address before anything is read (nil: everyone;
// auth.Mode.Allow for the protected default).
func WithTransportSecurity(tc *tls.Config, token []byte, allow func(net.Addr) bool) Option {
	return func(s *Service) {
		s.tls, s.token, s.allow = tc, append([]byte(nil), token...), allow
		if token == nil {
			s.token = nil
		}
	}
}
