package oplog

import (
	"errors"
	"fmt"
	"hash/crc32"
)

//go:generate msgp -tests=false -io=false

// Entry is one logged metadata change.
type Entry struct {
	Seq     uint64 `msg:"seq"`
	Term    uint64 `msg:"term"` // the producer's leadership term
	Time    int64  `msg:"time"` // unix nanoseconds on the producer's clock
	Kind    uint8  `msg:"kind"` // master.OpKind
	Key     string `msg:"key"`
	Payload []byte `msg:"payload"` // the rest of the op, encoded by its producer
	CRC     uint32 `msg:"crc"`
}

// Limits on what one entry may hold (the reference's: 4 KiB keys, 10 MiB
// payloads); a decoder refuses more before allocating.
const (
	MaxKey     = 4 << 10
	MaxPayload = 10 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors of every Store.
var (
	ErrGap       = errors.New("oplog: sequence ids not contiguous")
	ErrFenced    = errors.New("oplog: fenced (a newer term, or a persisted seq with other bytes)")
	ErrFailed    = errors.New("oplog: store failed; nothing more is acknowledged")
	ErrCorrupt   = errors.New("oplog: entry checksum mismatch")
	ErrCompacted = errors.New("oplog: entry compacted")
	ErrTooLarge  = errors.New("oplog: entry too large")
	ErrClosed    = errors.New("oplog: store closed")
)

// Sum is the entry's checksum: CRC32C of its encoding with CRC 0.
func (e *Entry) Sum() uint32 {
	c := *e
	c.CRC = 0
	b, err := c.MarshalMsg(make([]byte, 0, c.Msgsize()))
	if err != nil {
		panic(err) // only on types msgp cannot encode; Entry has none
	}
	return crc32.Checksum(b, castagnoli)
}

// Seal sets CRC; Verify checks it and the limits.
func (e *Entry) Seal() { e.CRC = e.Sum() }

// Verify reports ErrCorrupt or ErrTooLarge for a bad entry.
func (e *Entry) Verify() error {
	if err := e.checkLimits(); err != nil {
		return err
	}
	return e.checkSum()
}

func (e *Entry) checkLimits() error {
	if len(e.Key) > MaxKey || len(e.Payload) > MaxPayload {
		return fmt.Errorf("%w: seq %d: key %d bytes, payload %d bytes", ErrTooLarge, e.Seq, len(e.Key), len(e.Payload))
	}
	return nil
}

func (e *Entry) checkSum() error {
	if s := e.Sum(); s != e.CRC {
		return fmt.Errorf("%w: seq %d: crc %#x, computed %#x", ErrCorrupt, e.Seq, e.CRC, s)
	}
	return nil
}
