package rdma

import (
	"sync/atomic"
	"time"
)

type counters struct {
	posted, completed, retried, failed, wcErrors atomic.Uint64
	postCalls, pollCalls                         atomic.Uint64
	handshakes, handshakeErrors, passive         atomic.Uint64
	evictions, failedEndpoints, resets           atomic.Uint64
}

// Stats is a snapshot of the transport's counters.
type Stats struct {
	NICs int
	// Endpoints and PassiveEndpoints are cached now (ours and those
	// peers connected); Limbo ones are out of service, waiting for
	// their completions.
	Endpoints, PassiveEndpoints, Limbo int

	SlicesPosted    uint64 // work requests posted
	SlicesCompleted uint64 // completed successfully
	SlicesRetried   uint64 // sent again on another path after an error
	SlicesFailed    uint64 // ended in error
	WCErrors        uint64 // error completions (flushes excluded)

	PostCalls uint64 // QP.PostSend calls
	PollCalls uint64 // CQ.Poll calls

	Handshakes      uint64 // endpoint handshakes we started
	HandshakeErrors uint64 // ours that failed plus peers' we refused
	PassiveAccepted uint64 // peers' handshakes accepted
	Evictions       uint64 // endpoints evicted from the cache
	FailedEndpoints uint64 // endpoints taken out of service after errors
	QPResets        uint64 // QPs reset because their flush was overdue
	Pauses          uint64 // times a NIC pair was paused
	PausedPairs     int    // NIC pairs paused now
	NICsDown        int    // NICs whose port is not active now
}

// Stats returns the transport's counters.
func (t *Transport) Stats() Stats {
	a, p, l := t.cache.counts()
	s := Stats{
		NICs: len(t.nics), Endpoints: a, PassiveEndpoints: p, Limbo: l,
		SlicesPosted: t.st.posted.Load(), SlicesCompleted: t.st.completed.Load(), SlicesRetried: t.st.retried.Load(),
		SlicesFailed: t.st.failed.Load(), WCErrors: t.st.wcErrors.Load(),
		PostCalls: t.st.postCalls.Load(), PollCalls: t.st.pollCalls.Load(),
		Handshakes: t.st.handshakes.Load(), HandshakeErrors: t.st.handshakeErrors.Load(), PassiveAccepted: t.st.passive.Load(),
		Evictions: t.st.evictions.Load(), FailedEndpoints: t.st.failedEndpoints.Load(), QPResets: t.st.resets.Load(),
		Pauses: t.health.pauses.Load(), PausedPairs: t.health.pausedNow(time.Now()),
	}
	for _, n := range t.nics {
		if !n.up.Load() {
			s.NICsDown++
		}
	}
	return s
}
