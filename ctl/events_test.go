package ctl

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/syncbuf"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store"
)

// TestEvents tails the master's KV events from the replay buffer: a put
// and a remove of a key that names a block hash, text and json.
func TestEvents(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	require.NoError(t, c.client.Put(ctx, "0x1f", []byte("block"), store.ReplicateConfig{}))
	// One batch each: the remove waits until the put's batch is out.
	testutil.Eventually(t, "the put's batch", func() bool { return c.pub.Stats().PublishedBatches == 1 })
	require.NoError(t, c.client.Remove(ctx, "0x1f", true))
	testutil.Eventually(t, "the remove's batch", func() bool { return c.pub.Stats().PublishedBatches == 2 })

	ev := []string{"events", "--events", c.events, "--replay", c.replay}
	r := c.ctl(t, "", append(ev, "--replay-from", "0", "--count", "2")...)
	require.Equal(t, ExitOK, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 2, r.stdout)
	assert.Regexp(t, `^seq 0 \d{4}-\d\d-\d\dT[0-9:.]+Z \(replayed\) BlockStored hashes=\[0x1f\] medium=\S+$`, lines[0])
	assert.Regexp(t, `^seq 1 \S+ \(replayed\) BlockRemoved hashes=\[0x1f\]`, lines[1])

	r = c.ctl(t, "", append(ev, "--replay-from", "1", "--count", "1", "-o", "json")...)
	require.Equal(t, ExitOK, r.code, r.stderr)
	var b batchOut
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &b), r.stdout)
	assert.Equal(t, uint64(1), b.Seq)
	assert.True(t, b.Replayed)
	require.Len(t, b.Events, 1)
	assert.Equal(t, "BlockRemoved", b.Events[0].Type)
	assert.Equal(t, []string{"0x1f"}, b.Events[0].BlockHashes)
}

// Without --count, events runs until its context ends, then exits 0.
func TestEventsUntilCancelled(t *testing.T) {
	c := startCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"events", "--events", c.events, "--replay", c.replay, "--replay-from", "0"},
			IO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
	}()
	require.NoError(t, c.client.Put(context.Background(), "0x2a", []byte("block"), store.ReplicateConfig{}))
	testutil.Eventually(t, "the batch printed", func() bool { return strings.Contains(out.String(), "hashes=[0x2a]") })
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, ExitOK, code, errb.String())
	case <-time.After(30 * time.Second):
		t.Fatal("events did not stop")
	}
}
