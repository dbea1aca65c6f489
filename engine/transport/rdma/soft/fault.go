package soft

import (
	"fmt"
	"time"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// FaultKind selects what an injected fault does to the work requests it
// matches (requests posted on this device, the requester side).
type FaultKind int

const (
	// FaultError completes the work request with Status (default
	// WCRetryExcErr) without moving data; the QP goes to ERR and the
	// work queued behind it is flushed, as on a real HCA.
	FaultError FaultKind = iota
	// FaultDrop moves the data but loses the completion.
	FaultDrop
	// FaultDelay executes the work request Delay after it was posted.
	FaultDelay
	// FaultHang stops the QP: nothing is executed or flushed (not even
	// after SetError) until the fault is removed; Reset or Close clear
	// the queue. This is a hung HCA or a lost completion stream.
	FaultHang
)

func (k FaultKind) String() string {
	switch k {
	case FaultError:
		return "error"
	case FaultDrop:
		return "drop"
	case FaultDelay:
		return "delay"
	case FaultHang:
		return "hang"
	}
	return fmt.Sprintf("FaultKind(%d)", int(k))
}

// Fault describes an injected fault.
type Fault struct {
	Kind FaultKind
	// QPN restricts the fault to one QP; 0 matches every QP of the
	// device.
	QPN uint32
	// Count is how many work requests it affects; 0 means until
	// removed. FaultHang ignores it.
	Count int
	// Status is FaultError's completion status.
	Status rdmadev.WCStatus
	// Delay is FaultDelay's delay.
	Delay time.Duration
}

type faultEntry struct {
	Fault
	left int
}

// Inject adds a fault and returns its removal.
func (d *Device) Inject(f Fault) (remove func()) {
	e := &faultEntry{Fault: f, left: f.Count}
	d.mu.Lock()
	d.faults = append(d.faults, e)
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		for i, x := range d.faults {
			if x == e {
				d.faults = append(d.faults[:i], d.faults[i+1:]...)
				break
			}
		}
		d.mu.Unlock()
		d.kickAll()
	}
}

// ClearFaults removes every injected fault.
func (d *Device) ClearFaults() {
	d.mu.Lock()
	d.faults = nil
	d.mu.Unlock()
	d.kickAll()
}

// ErrorQP moves a QP to ERR asynchronously, as a fatal QP event does:
// its queued work requests complete with WCWRFlushErr.
func (d *Device) ErrorQP(qpn uint32) error {
	d.mu.Lock()
	q := d.qps[qpn]
	if q == nil {
		d.mu.Unlock()
		return fmt.Errorf("%w: no QP %#x on %s", rdmadev.ErrInvalid, qpn, d.name)
	}
	q.state = rdmadev.QPError
	d.mu.Unlock()
	d.enqueue(q)
	return nil
}

// BreakCQs makes every CQ of the device fail (as an overrun or a
// catastrophic device error does): Poll returns ErrCQOverrun from now on
// and waiters wake up.
func (d *Device) BreakCQs() {
	d.mu.Lock()
	cqs := make([]*cq, 0, len(d.cqs))
	for c := range d.cqs {
		cqs = append(cqs, c)
	}
	d.mu.Unlock()
	for _, c := range cqs {
		c.mu.Lock()
		c.overrun = true
		c.mu.Unlock()
		select {
		case c.ev <- struct{}{}:
		default:
		}
	}
}

func (e *faultEntry) matches(qpn uint32) bool { return e.QPN == 0 || e.QPN == qpn }

// delayLocked returns the delay for a work request posted now on qpn.
func (d *Device) delayLocked(qpn uint32) time.Duration {
	for i, e := range d.faults {
		if e.Kind == FaultDelay && e.matches(qpn) {
			d.consumeLocked(i, e)
			return e.Delay
		}
	}
	return 0
}

// hungLocked reports whether a FaultHang covers qpn.
func (d *Device) hungLocked(qpn uint32) bool {
	for _, e := range d.faults {
		if e.Kind == FaultHang && e.matches(qpn) {
			return true
		}
	}
	return false
}

// takeLocked returns the error or drop fault applying to the next work
// request executed on qpn, consuming one of its count.
func (d *Device) takeLocked(qpn uint32) *faultEntry {
	for i, e := range d.faults {
		if (e.Kind == FaultError || e.Kind == FaultDrop) && e.matches(qpn) {
			d.consumeLocked(i, e)
			return e
		}
	}
	return nil
}

func (d *Device) consumeLocked(i int, e *faultEntry) {
	if e.Count == 0 {
		return
	}
	e.left--
	if e.left <= 0 {
		d.faults = append(d.faults[:i], d.faults[i+1:]...)
	}
}
