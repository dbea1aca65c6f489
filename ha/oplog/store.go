package oplog

import "context"

// Store is a durable operation log; see the package doc for the contract
// every backend keeps.
type Store interface {
	// Append makes entries durable, in order, under term. They must be
	// sealed and start at LastSeq()+1 with no gap.
	Append(ctx context.Context, term uint64, entries []Entry) error
	// Read returns up to max durable entries from seq from on (fewer at
	// the end of the log; none past it).
	Read(ctx context.Context, from uint64, max int) ([]Entry, error)
	// LastSeq is the last durable seq (0 for an empty log); FirstSeq the
	// first one still held (after compaction, the one after the cut).
	LastSeq(ctx context.Context) (uint64, error)
	FirstSeq(ctx context.Context) (uint64, error)
	// Compact deletes the entries below seq before.
	Compact(ctx context.Context, before uint64) error
	Close() error
}
