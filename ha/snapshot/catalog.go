package snapshot

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrNoSnapshot is what Catalog.Latest returns when nothing was ever
// published: a fresh cluster, not a failure. A backend that cannot be
// read returns its own error instead, so a caller never mistakes an
// unreachable catalog for an empty one and starts from an empty state.
var ErrNoSnapshot = errors.New("snapshot: no snapshot published")

// ErrNotFound is returned for an id the catalog or payload store does not
// hold.
var ErrNotFound = errors.New("snapshot: not found")

// Meta describes one published snapshot.
type Meta struct {
	// ID names the snapshot in the catalog and the payload store: the
	// last included seq as 20 decimal digits, "-", the term as 20 decimal
	// digits (IDFor), so ids sort as the snapshots do.
	ID string
	// Seq is the last operation-log seq the snapshot includes: recovery
	// replays from Seq+1.
	Seq  uint64
	Term uint64
	// Created is when the snapshot was taken (the writer's clock).
	Created time.Time
	// Size is the payload's length in bytes and Checksum its CRC32C
	// (Castagnoli).
	Size     int64
	Checksum uint32
}

// Payloads stores snapshot bodies.
type Payloads interface {
	// Create returns a writer for id's body; nothing is visible under id
	// until Commit returns nil (the bytes are durable then). Abort drops
	// what was written. Creating an id that exists is an error.
	Create(ctx context.Context, id string) (PayloadWriter, error)
	// Open reads id's body; ErrNotFound when it is absent.
	Open(ctx context.Context, id string) (io.ReadCloser, error)
	// Delete removes id's body; deleting an absent id is not an error.
	Delete(ctx context.Context, id string) error
}

// PayloadWriter is a body being written.
type PayloadWriter interface {
	io.Writer
	Commit() error
	Abort() error
}

// Catalog records which snapshots exist and which is the latest. Publish
// is called only after the payload is committed, so a published snapshot
// is always readable.
type Catalog interface {
	// Publish records m and makes it the latest when its Seq is the
	// highest published.
	Publish(ctx context.Context, m Meta) error
	// Latest is the published snapshot with the highest Seq, or
	// ErrNoSnapshot.
	Latest(ctx context.Context) (Meta, error)
	// List returns every published snapshot by ascending Seq.
	List(ctx context.Context) ([]Meta, error)
	// Delete forgets id (the payload is the caller's to delete);
	// deleting an absent id is not an error.
	Delete(ctx context.Context, id string) error
	Close() error
}
