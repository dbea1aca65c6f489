package zmtp

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func servePub(t *testing.T, cfg PubConfig) (*Pub, Endpoint) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := NewPub(cfg)
	p.Serve(ln)
	t.Cleanup(func() { p.Close() })
	e, err := Parse("tcp://" + ln.Addr().String())
	require.NoError(t, err)
	return p, e
}

func dialSub(t *testing.T, e Endpoint) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialConn(ctx, e, zmq4.Sub)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByPeer waits for the publisher to end the connection; the read
// deadline only bounds a failing test.
func closedByPeer(t *testing.T, c *Conn) {
	t.Helper()
	require.NoError(t, c.raw.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := c.ReadMsg()
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the publisher kept the connection: %v", err)
}

func TestPubRefusesOversizedSubscription(t *testing.T) {
	p, e := servePub(t, PubConfig{})
	c := dialSub(t, e)
	require.NoError(t, c.Write(AppendMsg(nil, append([]byte{1}, strings.Repeat("t", DefaultMaxTopic+1)...))))
	closedByPeer(t, c)
	assert.Equal(t, 0, p.Subscribers())

	// The longest allowed topic works.
	topic := strings.Repeat("t", DefaultMaxTopic)
	c = dialSub(t, e)
	require.NoError(t, c.Write(AppendMsg(nil, append([]byte{1}, topic...))))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, p.WaitSubscribers(ctx, 1))
	p.Send(ctx, topic+"x", AppendMsg(nil, []byte(topic+"x"), []byte("body")))
	require.NoError(t, c.raw.SetReadDeadline(time.Now().Add(10*time.Second)))
	msg, err := c.ReadMsg()
	require.NoError(t, err)
	assert.Equal(t, "body", string(msg[1]))
}

func TestPubAcceptsOnlySubscriptions(t *testing.T) {
	_, e := servePub(t, PubConfig{})
	for name, msg := range map[string][]byte{
		"two frames":    AppendMsg(nil, []byte{1, 'a'}, []byte("b")),
		"not 0 or 1":    AppendMsg(nil, []byte{2, 'a'}),
		"empty":         AppendMsg(nil, []byte{}),
		"big frame":     AppendMsg(nil, make([]byte, 64<<10)),
		"huge header":   longHeader(0, 1<<40),
		"long chain":    []byte{flagMore, 0, flagMore, 0, 0, 0},
		"big command":   longHeader(flagCommand, 1<<20),
		"command chain": {flagMore, 2, 1, 'a', flagCommand, 0},
	} {
		t.Run(name, func(t *testing.T) {
			c := dialSub(t, e)
			require.NoError(t, c.Write(msg))
			closedByPeer(t, c)
		})
	}
}

func TestPubBoundsSubscriptionCount(t *testing.T) {
	p, e := servePub(t, PubConfig{MaxSubscriptions: 4})
	c := dialSub(t, e)
	var in []byte
	for i := range 5 {
		in = AppendMsg(in, []byte{1, 'a' + byte(i)})
	}
	require.NoError(t, c.Write(in))
	closedByPeer(t, c)
	require.Eventually(t, func() bool { return p.Subscribers() == 0 }, 10*time.Second, time.Millisecond)
}

// A connection DialConn returned stays open when the caller cancels the
// dial's context right after (its watcher used to pick ctx.Done or the
// handshake's end at random, and then close the connection).
func TestDialConnSurvivesCancelAfterReturn(t *testing.T) {
	_, e := servePub(t, PubConfig{})
	for i := range 100 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := DialConn(ctx, e, zmq4.Sub)
		require.NoError(t, err)
		cancel()
		time.Sleep(time.Millisecond) // let a stray watcher run
		require.NoError(t, c.raw.SetReadDeadline(time.Now().Add(time.Second)), "dial %d: closed after cancel", i)
		c.Close()
	}
}
