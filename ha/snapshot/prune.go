package snapshot

import (
	"context"
	"errors"
	"fmt"
)

// Prune keeps the newest keep (>= 1) published snapshots and deletes the
// older ones, each catalog entry first and its payload after: a crash in
// between leaves an orphan payload (CleanOrphans removes it), never a
// catalog entry without a body. It returns the ids it deleted, in
// ascending order, also when it stops on an error.
func Prune(ctx context.Context, cat Catalog, pl Payloads, keep int) (deleted []string, err error) {
	if keep < 1 {
		return nil, fmt.Errorf("snapshot: prune: keep %d, want at least 1", keep)
	}
	ms, err := cat.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapshot: prune: %w", err)
	}
	for i := 0; i < len(ms)-keep; i++ {
		id := ms[i].ID
		if err := cat.Delete(ctx, id); err != nil {
			return deleted, fmt.Errorf("snapshot: prune: %w", err)
		}
		if err := pl.Delete(ctx, id); err != nil {
			return deleted, fmt.Errorf("snapshot: prune: catalog entry %s deleted, payload left: %w", id, err)
		}
		deleted = append(deleted, id)
	}
	return deleted, nil
}

// ListablePayloads is a payload store that can list its committed
// bodies (LocalPayloads).
type ListablePayloads interface {
	Payloads
	// IDs lists the committed bodies by ascending id.
	IDs(ctx context.Context) ([]string, error)
}

// CleanOrphans deletes payloads the catalog does not list and whose id is
// below the latest one: bodies a crash left between Commit and Publish,
// or inside Prune. Bodies above the latest are kept, as they may be
// about to be published; still, run it when no snapshot is being
// written (at start-up). With nothing published it deletes nothing.
func CleanOrphans(ctx context.Context, cat Catalog, pl ListablePayloads) (deleted []string, err error) {
	latest, err := cat.Latest(ctx)
	if errors.Is(err, ErrNoSnapshot) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: clean orphans: %w", err)
	}
	ms, err := cat.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapshot: clean orphans: %w", err)
	}
	listed := make(map[string]bool, len(ms))
	for _, m := range ms {
		listed[m.ID] = true
	}
	ids, err := pl.IDs(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapshot: clean orphans: %w", err)
	}
	for _, id := range ids {
		if listed[id] || id >= latest.ID {
			continue
		}
		if err := pl.Delete(ctx, id); err != nil {
			return deleted, fmt.Errorf("snapshot: clean orphans: %w", err)
		}
		deleted = append(deleted, id)
	}
	return deleted, nil
}
