package master

import (
	"github.com/crescent-kv/crescent/store/errcode"
)

// Suspect segments: while a dead client waits out ClientTTL its segments
// stay mounted, and every replica placed there makes a put fail. A client
// whose write to a segment failed reports it; the segment becomes suspect
// and placement avoids it (alloc.Choose) until its owner's next Ping
// shows it alive. A report is only a hint, so a buggy or hostile reporter
// can do little: it removes no data, its own segments are ignored, a
// suspect segment still takes puts that have nowhere else to go, and the
// owner's heartbeat clears it within a heartbeat interval. The flag is
// soft state, like heartbeats: never logged, fresh on a new leader.

// MaxReportSegments bounds the segment ids of one report.
const MaxReportSegments = 64

// ReportFailedSegments records that writes from reporter to the segments
// ids failed, and returns how many became suspect. Unknown ids, segments
// being unmounted and the reporter's own segments are skipped.
func (m *Master) ReportFailedSegments(reporter UUID, ids []UUID) (int, error) {
	switch {
	case reporter.IsZero():
		return 0, errcode.New(errcode.InvalidParams, "client id is zero")
	case len(ids) > MaxReportSegments:
		return 0, errcode.New(errcode.InvalidParams, "%d segments reported > %d", len(ids), MaxReportSegments)
	}
	n := 0
	for _, id := range ids {
		if idx, ok := m.alloc.Lookup(id); !ok {
			continue
		} else if s, ok := m.alloc.Segment(idx); !ok || s.Client == reporter {
			continue
		}
		m.segmentReports.Add(1)
		owner, changed, _ := m.alloc.MarkSuspect(id)
		if changed {
			n++
			// Logged on the change only: repeated reports cost nothing.
			m.cfg.Logger.Warn("master: writes to a segment failed; placing new replicas elsewhere until its client pings",
				"segment", id.String(), "client", owner.String(), "reporter", reporter.String())
		}
	}
	return n, nil
}

// clearSuspect clears the suspect flag of a client's segments: it is
// alive (it just pinged).
func (m *Master) clearSuspect(client UUID) {
	if n := m.alloc.ClearSuspect(client); n > 0 {
		m.cfg.Logger.Info("master: client pinged; its suspect segments take replicas again", "client", client.String(), "segments", n)
	}
}
