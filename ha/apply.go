package ha

import (
	"errors"
	"fmt"
	"sync"

	"github.com/crescent-kv/crescent/ha/oplog"
	"github.com/crescent-kv/crescent/store/master"
)

// Why an Applier stopped; an *ApplyError wraps exactly one of them.
var (
	// ErrGap: a seq is missing (a later one is durable, or more entries
	// wait for it than the buffer holds).
	ErrGap = errors.New("ha: gap in the log")
	// ErrRegression: a seq arrived again with other bytes than those
	// applied (or buffered) for it: two histories of the log.
	ErrRegression = errors.New("ha: seq regressed with different bytes")
	// ErrChecksum: an entry failed its checksum or limits (oplog.Verify),
	// or the store found the log corrupt (oplog.ErrCorrupt).
	ErrChecksum = errors.New("ha: entry checksum mismatch")
	// ErrTermRegressed: an entry carries a lower term than one applied
	// before it (a deposed leader's entry past a newer leader's).
	ErrTermRegressed = errors.New("ha: term went backwards")
	// ErrDiverged: the op did not decode or the master refused it
	// (master.ErrReplayDiverged): the replica no longer matches the log.
	ErrDiverged = errors.New("ha: replica diverged from the log")
)

// ApplyError is an Applier's failure: the seq at fault, the reason (one
// of the Err* sentinels above, for errors.Is) and the cause.
type ApplyError struct {
	Seq    uint64
	Reason error
	Err    error // the cause (oplog.ErrCorrupt, master.ErrReplayDiverged, ...), may be nil
}

func (e *ApplyError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("%v at seq %d", e.Reason, e.Seq)
	}
	return fmt.Sprintf("%v at seq %d: %v", e.Reason, e.Seq, e.Err)
}

// Unwrap gives both the reason and the cause to errors.Is and As.
func (e *ApplyError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Reason}
	}
	return []error{e.Reason, e.Err}
}

// ApplierOptions bound an Applier's memory; the zero value is the default.
type ApplierOptions struct {
	// MaxPending and MaxPendingBytes bound the entries buffered ahead of
	// a missing seq (defaults 4096 and 64 MiB); past them it is ErrGap.
	MaxPending      int
	MaxPendingBytes int
	// Window is how many recently applied seqs keep their checksum, to
	// tell a harmless resend from a regression (default 4096). A resend
	// older than the window is skipped unchecked.
	Window int
}

func (o *ApplierOptions) fill() {
	if o.MaxPending <= 0 {
		o.MaxPending = 4096
	}
	if o.MaxPendingBytes <= 0 {
		o.MaxPendingBytes = 64 << 20
	}
	if o.Window <= 0 {
		o.Window = 4096
	}
}

// Applier applies log entries to a master strictly in seq order. It is
// safe for concurrent use, though entries are meant to come from one
// reader.
type Applier struct {
	m    *master.Master
	opts ApplierOptions

	mu       sync.Mutex
	applied  uint64
	term     uint64                 // highest term applied
	pending  map[uint64]oplog.Entry // out of order, waiting for applied+1
	pbytes   int
	crcs     []uint32 // ring: crcs[seq%Window] of applied seqs in the window
	err      *ApplyError
	nApplied uint64
}

// NewApplier returns an applier for m, whose state covers the log up to
// seq applied (0: empty).
func NewApplier(m *master.Master, applied uint64, opts ApplierOptions) *Applier {
	opts.fill()
	return &Applier{m: m, opts: opts, applied: applied, pending: map[uint64]oplog.Entry{},
		crcs: make([]uint32, opts.Window)}
}

// Applied is the last seq applied.
func (a *Applier) Applied() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.applied
}

// Err is the failure that stopped the applier (an *ApplyError), nil while
// it works.
func (a *Applier) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err == nil {
		return nil
	}
	return a.err
}

// Pending is how many entries are buffered ahead of a missing seq.
func (a *Applier) Pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pending)
}

// Apply takes entries in any order: each is verified; one at the next seq
// is replayed (then any buffered ones that follow it), one ahead of it
// is buffered, one at or below the applied seq is skipped if its bytes
// are those applied. The first failure stops the applier for good:
// nothing more is applied and every later call returns it.
func (a *Applier) Apply(es ...oplog.Entry) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range es {
		if a.err != nil {
			break
		}
		a.offer(&es[i])
	}
	if a.err != nil {
		return a.err
	}
	return nil
}

// Complete says the caller has handed over every entry the log holds up
// to seq last (a read from Applied()+1 returned them): a seq at or below
// last still missing is ErrGap.
func (a *Applier) Complete(last uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err == nil && a.applied < last {
		a.fail(a.applied+1, ErrGap, fmt.Errorf("the log holds seqs to %d", last))
	}
	if a.err != nil {
		return a.err
	}
	return nil
}

// failWith stops the applier for a reason found outside it (a corrupt
// read).
func (a *Applier) failWith(seq uint64, reason, cause error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fail(seq, reason, cause)
}

func (a *Applier) fail(seq uint64, reason, cause error) {
	if a.err == nil {
		a.err = &ApplyError{Seq: seq, Reason: reason, Err: cause}
		clear(a.pending)
		a.pbytes = 0
	}
}

func (a *Applier) offer(e *oplog.Entry) {
	if err := e.Verify(); err != nil {
		a.fail(e.Seq, ErrChecksum, err)
		return
	}
	switch {
	case e.Seq == 0:
		a.fail(0, ErrChecksum, errors.New("seq 0"))
	case e.Seq <= a.applied:
		if a.applied-e.Seq < uint64(a.opts.Window) && a.inWindow(e.Seq) && a.crcs[e.Seq%uint64(a.opts.Window)] != e.CRC {
			a.fail(e.Seq, ErrRegression, fmt.Errorf("applied with crc %#x, now %#x", a.crcs[e.Seq%uint64(a.opts.Window)], e.CRC))
		}
	case e.Seq == a.applied+1:
		a.replay(e)
		for a.err == nil {
			next, ok := a.pending[a.applied+1]
			if !ok {
				break
			}
			delete(a.pending, next.Seq)
			a.pbytes -= entryBytes(&next)
			a.replay(&next)
		}
	default:
		if old, ok := a.pending[e.Seq]; ok {
			if old.CRC != e.CRC {
				a.fail(e.Seq, ErrRegression, fmt.Errorf("buffered with crc %#x, now %#x", old.CRC, e.CRC))
			}
			return
		}
		if len(a.pending) >= a.opts.MaxPending || a.pbytes+entryBytes(e) > a.opts.MaxPendingBytes {
			a.fail(a.applied+1, ErrGap, fmt.Errorf("%d entries (%d bytes) wait for it, seq %d arrived", len(a.pending), a.pbytes, e.Seq))
			return
		}
		a.pending[e.Seq] = *e
		a.pbytes += entryBytes(e)
	}
}

// inWindow: applied seqs below the start (a snapshot's) have no crc.
func (a *Applier) inWindow(seq uint64) bool { return seq > a.applied-min(a.applied, a.nApplied) }

func entryBytes(e *oplog.Entry) int { return len(e.Key) + len(e.Payload) + 64 }

func (a *Applier) replay(e *oplog.Entry) {
	if e.Term < a.term {
		a.fail(e.Seq, ErrTermRegressed, fmt.Errorf("term %d after term %d", e.Term, a.term))
		return
	}
	op, err := oplog.DecodeOp(e)
	if err == nil {
		err = a.m.Replay(op)
	}
	if err != nil {
		a.fail(e.Seq, ErrDiverged, err)
		return
	}
	a.term = e.Term
	a.applied = e.Seq
	a.crcs[e.Seq%uint64(a.opts.Window)] = e.CRC
	a.nApplied++
}
