package supervisor

import (
	"encoding/json"
	"net/http"
)

// RoleJSON is the body of /role.
type RoleJSON struct {
	Role       string `json:"role"`
	Term       uint64 `json:"term"`
	Leader     string `json:"leader"`
	AppliedSeq uint64 `json:"applied_seq"`
}

// LeaderJSON is the body of /leader.
type LeaderJSON struct {
	Leader      string `json:"leader"`
	ViewVersion uint64 `json:"view_version"`
}

// RoleHandler serves /role: RoleJSON, always 200.
func (s *Supervisor) RoleHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := s.Status()
		writeJSON(w, http.StatusOK, RoleJSON{Role: st.Role.String(), Term: st.Term, Leader: st.View.Leader, AppliedSeq: st.AppliedSeq})
	})
}

// LeaderHandler serves /leader: the last view seen, LeaderJSON (an empty
// leader and version 0: nobody leads).
func (s *Supervisor) LeaderHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := s.Status().View
		writeJSON(w, http.StatusOK, LeaderJSON{Leader: v.Leader, ViewVersion: v.Version})
	})
}

// NotServing answers 503 with RoleJSON: for /health and the master's
// pages while this master does not serve.
func (s *Supervisor) NotServing(w http.ResponseWriter) {
	st := s.Status()
	writeJSON(w, http.StatusServiceUnavailable, RoleJSON{Role: st.Role.String(), Term: st.Term, Leader: st.View.Leader, AppliedSeq: st.AppliedSeq})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
