package crpc

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReplyBuffersNotShared: reply frames come from a pool; a frame
// still being written (or queued behind another write) must never be
// handed to the next reply. Many concurrent calls on two connections,
// with replies on both sides of the coalescing and pooling limits, each
// get exactly their own answer.
func TestReplyBuffersNotShared(t *testing.T) {
	lis := listen(t)
	serveOn(t, lis)
	ctx := tctx(t)
	conns := []*Conn{dial(t, lis.Addr().String()), dial(t, lis.Addr().String())}
	sizes := []int{1, 100, 4 << 10, maxCoalesce - 100, maxCoalesce + 100, maxPooledReply + 1000}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Go(func() {
			c := conns[g%len(conns)]
			for i := range 60 {
				n := sizes[(g+i)%len(sizes)]
				v := fmt.Sprintf("%d/%d:", g, i) + strings.Repeat(string(rune('a'+(g+i)%26)), n)
				got, err := call(ctx, c, "Echo", v)
				if err != nil {
					errs <- err
					return
				}
				if got != "echo:"+v {
					errs <- fmt.Errorf("call %d/%d: got %d bytes starting %.20q, want %d starting %.20q", g, i, len(got), got, len(v)+5, "echo:"+v)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
