package admin

import (
	"net/http"
	"strings"

	"github.com/crescent-kv/crescent/internal/auth"
)

// RequireAdmin guards h's mutating requests (any method but GET, HEAD
// and OPTIONS: POST /snapshot and whatever comes later) with the admin
// credential, sent as "Authorization: Bearer <token>"; reads stay open.
// A nil token refuses every mutating request (no admin credential is
// configured). Answers 401 without the header, 403 with a wrong one.
func RequireAdmin(h http.Handler, token []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			h.ServeHTTP(w, r)
			return
		}
		if token == nil {
			http.Error(w, "admin operations need the admin credential, and this master has none (--admin_token_file)", http.StatusForbidden)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="crescent-master admin"`)
			http.Error(w, "admin operation: send the admin token as Authorization: Bearer <token>", http.StatusUnauthorized)
			return
		}
		if !auth.Equal([]byte(strings.TrimSpace(got)), token) {
			http.Error(w, "wrong admin token", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
