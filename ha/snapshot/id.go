package snapshot

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrBadID is returned for a snapshot id that is not IDFor's shape. Ids
// become file names and Redis members, so nothing else is accepted (no
// path separators, no dots).
var ErrBadID = errors.New("snapshot: bad snapshot id")

const (
	idDigits = 20             // digits of a uint64's maximum
	idLen    = 2*idDigits + 1 // seq "-" term
)

// IDFor is the id of the snapshot that includes the log up to seq,
// written in term: both as 20 zero-padded decimal digits, joined by "-",
// so that ids sort (as strings) by seq, then term.
func IDFor(seq, term uint64) string { return fmt.Sprintf("%020d-%020d", seq, term) }

// ParseID is IDFor's inverse; an id of any other shape is ErrBadID.
func ParseID(id string) (seq, term uint64, err error) {
	if len(id) != idLen || id[idDigits] != '-' {
		return 0, 0, badID(id)
	}
	for i := 0; i < idLen; i++ {
		if i != idDigits && (id[i] < '0' || id[i] > '9') {
			return 0, 0, badID(id)
		}
	}
	seq, err = strconv.ParseUint(id[:idDigits], 10, 64)
	if err != nil { // more than a uint64
		return 0, 0, badID(id)
	}
	term, err = strconv.ParseUint(id[idDigits+1:], 10, 64)
	if err != nil {
		return 0, 0, badID(id)
	}
	return seq, term, nil
}

func checkID(id string) error {
	_, _, err := ParseID(id)
	return err
}

func badID(id string) error {
	if len(id) > 64 {
		id = id[:64] + "..."
	}
	return fmt.Errorf("%w %q (want IDFor(seq, term): 20 digits, \"-\", 20 digits)", ErrBadID, id)
}

// checkMeta refuses a Meta that cannot be published: an id that is not
// IDFor(Seq, Term), a negative size, or a time JSON cannot hold.
func checkMeta(m Meta) error {
	seq, term, err := ParseID(m.ID)
	if err != nil {
		return err
	}
	if seq != m.Seq || term != m.Term {
		return fmt.Errorf("%w: %s does not name seq %d term %d", ErrBadID, m.ID, m.Seq, m.Term)
	}
	if y := m.Created.UTC().Year(); y < 0 || y > 9999 {
		return fmt.Errorf("snapshot: meta %s: created time %v is outside years 0-9999", m.ID, m.Created)
	}
	if m.Size < 0 {
		return fmt.Errorf("snapshot: meta %s: negative size %d", m.ID, m.Size)
	}
	return nil
}
