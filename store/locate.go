package store

import (
	"context"
	"time"

	"github.com/crescent-kv/crescent/store/errcode"
)

// Location is where an object is, as GetReplicaList answered: its size,
// its complete memory replicas in the order a read tries them, and the
// end of the read lease the query granted. Local servers (store/local)
// use it to tell whether bytes they cached still belong to the object.
type Location struct {
	Size     uint64
	Replicas []ReplicaLoc
	Deadline time.Time
}

// ReplicaLoc is one replica: its segment and address.
type ReplicaLoc struct {
	Segment string
	Addr    uint64
}

// Locate asks the master where key is, granting a read lease.
func (c *Client) Locate(ctx context.Context, key string) (Location, error) {
	if err := c.enter(); err != nil {
		return Location{}, err
	}
	defer c.leave()
	loc, err := c.locate(ctx, key)
	if err != nil {
		return Location{}, err
	}
	out := Location{Size: loc.size, Deadline: loc.deadline, Replicas: make([]ReplicaLoc, len(loc.reps))}
	for i, r := range loc.reps {
		out.Replicas[i] = ReplicaLoc{Segment: r.seg, Addr: r.addr}
	}
	return out, nil
}

// ReadAt reads the object loc describes into dst (at least loc.Size
// bytes) from the first replica that can be read, and fails with
// LEASE_EXPIRED when the read ended after loc's lease.
func (c *Client) ReadAt(ctx context.Context, key string, loc Location, dst []byte) (err error) {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	defer c.observeGet(time.Now(), &err)
	if uint64(len(dst)) < loc.Size || len(loc.Replicas) == 0 {
		return errInvalidRead(key, loc.Size, len(dst))
	}
	reps := make([]replicaRef, len(loc.Replicas))
	for i, r := range loc.Replicas {
		reps[i] = replicaRef{seg: r.Segment, addr: r.Addr}
	}
	if err := c.read(ctx, reps, dst[:loc.Size]); err != nil {
		return err
	}
	return c.checkLease(key, loc.Deadline)
}

func errInvalidRead(key string, size uint64, n int) error {
	return errcode.New(errcode.BufferOverflow, "%q: value of %d bytes, buffer of %d (or no replica)", key, size, n)
}
