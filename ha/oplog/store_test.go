package oplog

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// readAll reads a Store from seq from to its end, in small chunks so that
// reads start and end inside segments and batches.
func readAll(t testing.TB, s Store, from uint64) []Entry {
	t.Helper()
	var out []Entry
	for {
		es, err := s.Read(context.Background(), from, 7)
		require.NoError(t, err)
		if len(es) == 0 {
			return out
		}
		out = append(out, es...)
		from = es[len(es)-1].Seq + 1
	}
}
