package snapshot_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"time"

	"github.com/crescent-kv/crescent/ha/snapshot"
)

// Writing a snapshot: commit the body, then publish its Meta, then prune.
func ExampleNewLocalCatalog() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "snapshots-")
	defer os.RemoveAll(dir)
	payloads, err := snapshot.NewLocalPayloads(dir)
	if err != nil {
		panic(err)
	}
	catalog, err := snapshot.NewLocalCatalog(dir)
	if err != nil {
		panic(err)
	}
	defer catalog.Close()

	if _, err := catalog.Latest(ctx); errors.Is(err, snapshot.ErrNoSnapshot) {
		fmt.Println("fresh cluster: start empty")
	}
	for seq := uint64(100); seq <= 300; seq += 100 {
		body := []byte(fmt.Sprintf("state up to %d", seq))
		id := snapshot.IDFor(seq, 1)
		w, err := payloads.Create(ctx, id)
		if err != nil {
			panic(err)
		}
		w.Write(body)
		if err := w.Commit(); err != nil {
			panic(err)
		}
		err = catalog.Publish(ctx, snapshot.Meta{ID: id, Seq: seq, Term: 1, Created: time.Now(),
			Size: int64(len(body)), Checksum: crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli))})
		if err != nil {
			panic(err)
		}
	}
	deleted, _ := snapshot.Prune(ctx, catalog, payloads, 2)
	fmt.Println("pruned", deleted)
	m, _ := catalog.Latest(ctx)
	fmt.Println("recover from", m.ID, "then replay from seq", m.Seq+1)
	// Output:
	// fresh cluster: start empty
	// pruned [00000000000000000100-00000000000000000001]
	// recover from 00000000000000000300-00000000000000000001 then replay from seq 301
}
