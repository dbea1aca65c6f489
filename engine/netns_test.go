package engine_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport/tcp"
	"github.com/crescent-kv/crescent/internal/auth"
)

// netns is a network namespace joined to this one by a veth pair: the
// host end has HostIP, the namespace's end PeerIP, so a socket made in
// the namespace reaches the host from a non-loopback address that is
// not one of the host's own.
type netns struct {
	name, HostIP, PeerIP string
}

// newNetns creates the namespace, or skips the test saying why.
func newNetns(t *testing.T) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("end-to-end protected-default test needs root to create a network namespace and a veth pair")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("end-to-end protected-default test needs iproute2 (ip) to create a network namespace")
	}
	var r [3]byte
	rand.Read(r[:])
	sfx := fmt.Sprintf("%02x%02x", r[0], r[1])
	n := &netns{name: "crtest" + sfx}
	sub := fmt.Sprintf("10.213.%d.%d", r[2], int(r[0]&0x3f)*4)
	base := net.ParseIP(sub).To4()
	n.HostIP = net.IPv4(base[0], base[1], base[2], base[3]+1).String()
	n.PeerIP = net.IPv4(base[0], base[1], base[2], base[3]+2).String()
	vh, vn := "crh"+sfx, "crn"+sfx
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", n.name).Run()
		exec.Command("ip", "link", "del", vh).Run()
	})
	for _, args := range [][]string{
		{"netns", "add", n.name},
		{"link", "add", vh, "type", "veth", "peer", "name", vn},
		{"link", "set", vn, "netns", n.name},
		{"addr", "add", n.HostIP + "/30", "dev", vh},
		{"link", "set", vh, "up"},
		{"netns", "exec", n.name, "ip", "addr", "add", n.PeerIP + "/30", "dev", vn},
		{"netns", "exec", n.name, "ip", "link", "set", vn, "up"},
		{"netns", "exec", n.name, "ip", "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Skipf("end-to-end protected-default test: cannot create a network namespace with a veth pair here (ip %s: %v: %s)",
				strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return n
}

// Do runs f on a thread inside the namespace: sockets f creates belong to
// it.
func (n *netns) Do(t *testing.T, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- err
			return // the thread is left locked: it exits with the goroutine
		}
		defer self.Close()
		target, err := os.Open("/run/netns/" + n.name)
		if err != nil {
			done <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		f()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- err
			return // stays locked: Go ends the thread rather than reuse it
		}
		runtime.UnlockOSThread()
		done <- nil
	}()
	require.NoError(t, <-done)
}

func TestProtectedDefaultRefusesNonLoopbackPeer(t *testing.T) {
	// The decision and the wiring, without a namespace.
	cfg := engine.Config{}
	require.Contains(t, cfg.AuthLogLine(), "loopback peers only")
	require.True(t, auth.SameHost(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}))
	require.False(t, auth.SameHost(&net.TCPAddr{IP: net.ParseIP("203.0.113.9")}))

	ns := newNetns(t)
	// SameHost reads the host's addresses again at most every 50 ms.
	require.Eventually(t, func() bool { return auth.SameHost(&net.TCPAddr{IP: net.ParseIP(ns.HostIP)}) }, 10*time.Second, 10*time.Millisecond)
	start := func(cfg engine.Config) *node {
		cfg.LocalServerName = ns.HostIP
		cfg.Protocols = []string{"tcp"}
		// Bound the wait for a hello that never comes.
		cfg.Handshake.Timeout, cfg.TCP.DialTimeout = time.Second, time.Second
		return newNode(t, 1<<20, cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// dataPort reads from the data port after a READ header, from inside
	// the namespace, optionally authenticating first.
	dataPort := func(n *node, token []byte) (got []byte, err error) {
		addr := net.JoinHostPort(ns.HostIP, strconv.Itoa(n.e.LocalDesc().TCPDataPort))
		ns.Do(t, func() {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", addr, 5*time.Second); err != nil {
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if token != nil {
				if err = auth.Client(c, token, auth.PurposeTCPLane, 0); err != nil {
					return
				}
			}
			var hdr [tcp.HeaderSize]byte
			tcp.Header{Size: 64, Addr: n.addr(0), Opcode: tcp.OpRead | tcp.V2Flag}.Put(hdr[:])
			if _, err = c.Write(hdr[:]); err != nil {
				return
			}
			got = make([]byte, tcp.StatusSize+64)
			_, err = io.ReadFull(c, got)
		})
		return got, err
	}
	fetch := func(n *node, token []byte) (err error) {
		ns.Do(t, func() { _, err = metadata.Client{Token: token}.FetchDesc(ctx, n.e.Name(), nil) })
		return err
	}

	t.Run("protected", func(t *testing.T) {
		n := start(engine.Config{})
		require.ErrorIs(t, fetch(n, nil), metadata.ErrNoReply, "the handshake server served a peer from the network")
		_, err := dataPort(n, nil)
		require.Error(t, err, "the data port served a peer from the network")
		// A same-host peer dialling the host's address is still served.
		_, err = metadata.FetchDesc(ctx, n.e.Name(), nil)
		require.NoError(t, err)
	})
	t.Run("insecure", func(t *testing.T) {
		n := start(engine.Config{Insecure: true})
		require.NoError(t, fetch(n, nil))
		got, err := dataPort(n, nil)
		require.NoError(t, err)
		require.Equal(t, tcp.StatusOK, binary.LittleEndian.Uint64(got))
	})
	t.Run("mooncake compat", func(t *testing.T) {
		n := start(engine.Config{MooncakeCompat: true})
		require.NoError(t, fetch(n, nil))
	})
	t.Run("token", func(t *testing.T) {
		n := start(engine.Config{Token: testToken})
		require.NoError(t, fetch(n, testToken))
		require.Error(t, fetch(n, nil))
		got, err := dataPort(n, testToken)
		require.NoError(t, err)
		require.Equal(t, tcp.StatusOK, binary.LittleEndian.Uint64(got))
		require.Equal(t, n.buf[:64], got[tcp.StatusSize:])
		_, err = dataPort(n, nil)
		require.Error(t, err)
	})
}
