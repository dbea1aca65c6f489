package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
)

// SessionLen is the length of a client session secret.
const SessionLen = 32

// ErrBadSession means a call's session does not prove its client id.
var ErrBadSession = errors.New("auth: the session does not prove this client id")

// NewSession returns a fresh session secret and the client id it proves.
func NewSession() (session []byte, hi, lo uint64) {
	session = make([]byte, SessionLen)
	if _, err := rand.Read(session); err != nil {
		panic("auth: crypto/rand failed: " + err.Error()) // never on Linux >= 3.17
	}
	hi, lo, _ = ClientID(session)
	return session, hi, lo
}

// ClientID is the id a session proves: the first 16 bytes of
// SHA-256("crescent-client-id-v1" | session). The id is public (admin
// pages list it); the session never leaves the client and the master,
// and the master keeps no copy: it recomputes the id on every call, so
// nothing has to survive a restart or a failover.
func ClientID(session []byte) (hi, lo uint64, err error) {
	if len(session) != SessionLen {
		return 0, 0, fmt.Errorf("%w: session of %d bytes, want %d", ErrBadSession, len(session), SessionLen)
	}
	h := sha256.New()
	h.Write([]byte("crescent-client-id-v1"))
	h.Write(session)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return binary.BigEndian.Uint64(sum[:8]), binary.BigEndian.Uint64(sum[8:16]), nil
}

// CheckSession is nil when session proves the client id (hi, lo).
func CheckSession(session []byte, hi, lo uint64) error {
	h, l, err := ClientID(session)
	if err != nil {
		return err
	}
	if h != hi || l != lo {
		return ErrBadSession
	}
	return nil
}

// Equal compares a presented secret with the configured one in time
// independent of where they differ (and of their lengths, by hashing).
func Equal(presented, want []byte) bool {
	a, b := sha256.Sum256(presented), sha256.Sum256(want)
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}
