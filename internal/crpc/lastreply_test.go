package crpc

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A server that answers and closes at once (GracefulStop's last reply):
// the reply must be the call's outcome, not "connection lost", though the
// client's reader sees the end of the stream right after it. The caller
// used to pick at random between the reply and the connection's end when
// both were ready (TestGracefulStop failed about 1 in 100 under load).
func TestReplyBeforeCloseWins(t *testing.T) {
	lis := listen(t)
	defer lis.Close()
	body, err := proto.Marshal(wrapperspb.String("last"))
	require.NoError(t, err)
	go func() {
		for {
			nc, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				p := make([]byte, prefaceLen)
				if _, err := io.ReadFull(nc, p); err != nil {
					return
				}
				if _, err := nc.Write(preface()); err != nil {
					return
				}
				rd := newReader(nc, DefaultMaxFrame)
				f, err := rd.next()
				if err != nil || f.kind != kindRequest {
					return
				}
				out := make([]byte, headerLen, headerLen+len(body))
				out = append(out, body...)
				if putHeader(out, f.id, kindReply, DefaultMaxFrame) != nil {
					return
				}
				nc.Write(out) // and close at once
			}()
		}
	}()
	const calls = 300
	lost := 0
	for range calls {
		c := dial(t, lis.Addr().String())
		var got wrapperspb.StringValue
		err := c.Invoke(context.Background(), "/crpc.test.Svc/Echo", wrapperspb.String("x"), &got)
		if err != nil {
			lost++
			continue
		}
		require.Equal(t, "last", got.Value)
		c.Close()
	}
	require.Zero(t, lost, "%d of %d calls lost a reply that arrived before the close", lost, calls)
}
