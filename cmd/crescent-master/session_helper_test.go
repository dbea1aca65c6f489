package main

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/store/storepb"
)

// newSession is a client's session and the id it proves (the master
// refuses calls whose session does not prove their client id).
func newSession() ([]byte, *storepb.UUID) {
	s, hi, lo := auth.NewSession()
	return s, &storepb.UUID{High: hi, Low: lo}
}

// testAdminToken is what adminArgs gives the master as --admin_token_file.
const testAdminToken = "admin-token-0123456789abcdef"

// adminArgs are the flags giving the master an admin token.
func adminArgs(t testing.TB) []string {
	p := filepath.Join(t.TempDir(), "admin.token")
	require.NoError(t, os.WriteFile(p, []byte(testAdminToken+"\n"), 0o600))
	return []string{"--admin_token_file", p}
}

// adminPost POSTs to an admin endpoint with the admin token.
func adminPost(hc *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	return hc.Do(req)
}
