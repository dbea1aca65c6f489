package h2bound

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWriteTimeout: a client that stops reading fails the server's
// write after WriteTimeout and loses its connection (its bytes come
// back), and a frame h2bound injects from the reader meanwhile
// does not wait on that client for ever either.
func TestWriteTimeout(t *testing.T) {
	b := New(Config{MaxBytes: 1 << 20, Stall: time.Second, WriteTimeout: 200 * time.Millisecond})
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lis := b.Listener(tl)
	defer lis.Close()
	client, err := net.Dial("tcp", tl.Addr().String())
	require.NoError(t, err)
	defer client.Close() // never read
	nc, err := lis.Accept()
	require.NoError(t, err)
	defer nc.Close()
	c := nc.(*conn)

	// DATA frames of 16 KiB to the client until a write fails.
	frame := make([]byte, 9+16384)
	frame[2] = 0x40 // length 16384; type DATA; stream 1
	frame[8] = 1
	werr := make(chan error, 1)
	go func() {
		for {
			if _, err := c.Write(frame); err != nil {
				werr <- err
				return
			}
		}
	}()
	injected := make(chan struct{})
	go func() {
		time.Sleep(100 * time.Millisecond) // likely behind the blocked write
		c.inject(appendFrame(nil, frameWindowUpdate, 0, 1))
		close(injected)
	}()
	select {
	case err := <-werr:
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	case <-time.After(30 * time.Second):
		t.Fatal("the write to a client that does not read never failed")
	}
	select {
	case <-injected:
	case <-time.After(30 * time.Second):
		t.Fatal("inject waits on a client that does not read")
	}
	// And the connection is closed: gRPC's server, after a write error,
	// would leave it open for its reader to end.
	_, err = c.Read(make([]byte, 64))
	assert.ErrorIs(t, err, net.ErrClosed)
}
