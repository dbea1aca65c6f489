package admin

import (
	_ "embed"
	"net/http"
	"sort"

	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// The status page: one file, no external assets; it fetches
// status.json (relative, so it works behind a path prefix) every 2 s.
//
//go:embed status.html
var statusHTML []byte

// Role is who a master is in its cluster, for the status page.
type Role struct {
	Role   string `json:"role"`   // "single" (no HA), or the supervisor's: "standby", "candidate", "warmup", "leader"
	Term   uint64 `json:"term"`   // the leader term (0 without HA)
	Leader string `json:"leader"` // the leader's RPC address as this master last saw it (empty without HA)
}

// Single is the role of a master without HA.
var Single = Role{Role: "single"}

// WithRole makes /status.json report role() instead of Single.
func WithRole(role func() Role) Option {
	return func(o *options) { o.role = role }
}

// Status is the body of /status.json. It carries counters and segment
// names only: no client ids, credentials or tokens (identity is bound
// to connections; nothing here grants access).
type Status struct {
	Role
	Serving     bool   `json:"serving"` // false: a standby; the rest is empty
	ViewVersion uint64 `json:"view_version,omitempty"`

	Keys           int64  `json:"keys"`
	PendingKeys    int64  `json:"pending_keys"`
	SoftPinnedKeys int64  `json:"soft_pinned_keys"`
	HardPinnedKeys int64  `json:"hard_pinned_keys"`
	Capacity       uint64 `json:"capacity_bytes"`
	Allocated      uint64 `json:"allocated_bytes"`
	SegmentCount   int    `json:"segment_count"`
	ClientCount    int    `json:"client_count"`

	Segments []StatusSegment `json:"segments"`
	// Clients are numbered 1..n in the order of their first segment's
	// name, not identified: a client id is not for an open page.
	Clients []StatusClient `json:"clients"`

	// Puts and Gets count objects since start (committed puts, replica
	// lookups); the page derives rates from two samples.
	Puts uint64 `json:"puts"`
	Gets uint64 `json:"gets"`

	EvictionRuns    uint64 `json:"eviction_runs"`
	EvictedKeys     uint64 `json:"evicted_keys"`
	EvictedBytes    uint64 `json:"evicted_bytes"`
	ExpiredClients  uint64 `json:"expired_clients"`
	LostKeys        uint64 `json:"lost_keys"`
	DiscardedPuts   uint64 `json:"discarded_puts"`
	SuspectSegments int    `json:"suspect_segments"`
}

// StatusSegment is one mounted segment on the status page.
type StatusSegment struct {
	Name     string `json:"name"`
	Client   int    `json:"client"` // index into Status.Clients, from 1
	Protocol string `json:"protocol"`
	Status   string `json:"status"`
	Suspect  bool   `json:"suspect"`
	Capacity uint64 `json:"capacity_bytes"`
	Used     uint64 `json:"used_bytes"`
}

// StatusClient is one client with mounted segments.
type StatusClient struct {
	Number   int    `json:"number"`
	Segments int    `json:"segments"`
	Capacity uint64 `json:"capacity_bytes"`
	Used     uint64 `json:"used_bytes"`
}

// StatusOf reads the status of m (and svc's RPC counters, when svc is
// not nil).
func StatusOf(m *master.Master, svc *service.Service, role Role) Status {
	s := m.Stats()
	st := Status{
		Role: role, Serving: true, ViewVersion: m.ViewVersion(),
		Keys: s.Keys, PendingKeys: s.PendingKeys, SoftPinnedKeys: s.SoftPinnedKeys, HardPinnedKeys: s.HardPinnedKeys,
		Capacity: s.Capacity, Allocated: s.Allocated, SegmentCount: s.Segments, ClientCount: s.ActiveClients,
		EvictionRuns: s.EvictionRuns, EvictedKeys: s.EvictedKeys, EvictedBytes: s.EvictedBytes,
		ExpiredClients: s.ExpiredClients, LostKeys: s.LostKeys, DiscardedPuts: s.DiscardedPuts, SuspectSegments: s.SuspectSegments,
		Segments: []StatusSegment{}, Clients: []StatusClient{},
	}
	segs := m.AllSegments()
	sort.Slice(segs, func(i, j int) bool { return segs[i].Name < segs[j].Name })
	num := map[master.UUID]int{}
	for _, g := range segs {
		n, ok := num[g.Client]
		if !ok {
			n = len(st.Clients) + 1
			num[g.Client] = n
			st.Clients = append(st.Clients, StatusClient{Number: n})
		}
		c := &st.Clients[n-1]
		c.Segments++
		c.Capacity += g.Capacity
		c.Used += g.Used
		st.Segments = append(st.Segments, StatusSegment{Name: g.Name, Client: n, Protocol: g.Protocol,
			Status: g.Status.String(), Suspect: g.Suspect, Capacity: g.Capacity, Used: g.Used})
	}
	if svc != nil {
		for _, r := range svc.Counts() {
			switch r.Name {
			case "put_end":
				st.Puts += r.Requests - r.Failures
			case "batch_put_end", "commit_put":
				st.Puts += r.Items - r.ItemFailures
			case "get_replica_list":
				st.Gets += r.Requests - r.Failures
			case "batch_get_replica_list":
				st.Gets += r.Items - r.ItemFailures
			}
		}
	}
	return st
}

// StatusPage serves the status page itself (GET only); it reads
// status.json next to it.
func StatusPage() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		// Everything is inline; forbid anything else.
		h.Set("Content-Security-Policy", "default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-store")
		w.Write(statusHTML)
	})
}

// NotServingStatus answers /status.json for a master that does not
// serve now (an HA standby): its role, nothing else.
func NotServingStatus(w http.ResponseWriter, role Role) {
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, Status{Role: role, Segments: []StatusSegment{}, Clients: []StatusClient{}})
}
