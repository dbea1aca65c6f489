package metatest

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/internal/netx"
)

// DeadAddr is a loopback address where nothing listens.
func DeadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// BlackHole is a loopback address that accepts connections and never
// answers, until the test's cleanup.
func BlackHole(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := netx.Serve(ln, netx.Config{MaxConns: -1, MaxConnsPerHost: -1, Name: "black hole"}, func(c *netx.Conn) {
		c.Busy()
		io.Copy(io.Discard, c) // never answers; ends when either side closes
	})
	t.Cleanup(func() { l.Close() })
	return ln.Addr().String()
}

// RunUnreachable checks that Open of conn(addr) fails with
// ErrUnavailable, within its timeout, for a refused and a silent address.
func RunUnreachable(t *testing.T, conn func(addr string) string) {
	const timeout = time.Second
	for name, addr := range map[string]string{"refused": DeadAddr(t), "silent": BlackHole(t)} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			_, err := metadata.Open(conn(addr), metadata.Options{Timeout: timeout})
			if !errors.Is(err, metadata.ErrUnavailable) {
				t.Fatalf("Open: %v, want ErrUnavailable", err)
			}
			// Bounded by the timeout (plus slack for a loaded machine).
			if d := time.Since(start); d > timeout+10*time.Second {
				t.Fatalf("Open took %v with a %v timeout", d, timeout)
			}
			t.Logf("%s: %v after %v", name, err, time.Since(start).Round(time.Millisecond))
		})
	}
}
