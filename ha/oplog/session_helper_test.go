package oplog

import (
	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/store/storepb"
)

// newSession is a client's session and the id it proves (the master
// refuses calls whose session does not prove their client id).
func newSession() ([]byte, *storepb.UUID) {
	s, hi, lo := auth.NewSession()
	return s, &storepb.UUID{High: hi, Low: lo}
}
