package engine

import "sync/atomic"

// Stats are cumulative counters of an engine.
type Stats struct {
	Completed, Failed, TimedOut, Canceled uint64
	BytesTransferred                      uint64
	// NotificationsDropped counts notifications dropped (oldest first
	// beyond the budget, or larger than NotifyMaxMessage);
	// NotificationBytes is what the queued ones account for now.
	NotificationsDropped uint64
	NotificationBytes    uint64
}

type counters struct {
	completed, failed, timedOut, canceled, bytes atomic.Uint64
}

func (c *counters) record(s Status, n int) {
	switch s {
	case Completed:
		c.completed.Add(1)
		c.bytes.Add(uint64(n))
	case Failed:
		c.failed.Add(1)
	case Timeout:
		c.timedOut.Add(1)
	case Canceled:
		c.canceled.Add(1)
	}
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	e.notifyMu.Lock()
	dropped, held := e.notifies.dropped, e.notifies.bytes
	e.notifyMu.Unlock()
	return Stats{
		Completed:            e.stats.completed.Load(),
		Failed:               e.stats.failed.Load(),
		TimedOut:             e.stats.timedOut.Load(),
		Canceled:             e.stats.canceled.Load(),
		BytesTransferred:     e.stats.bytes.Load(),
		NotificationsDropped: dropped,
		NotificationBytes:    uint64(held),
	}
}
