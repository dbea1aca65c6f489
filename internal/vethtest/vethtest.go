// Package vethtest gives a test a network namespace joined to the
// current one by a veth pair, so that a peer with a non-loopback address
// can dial a listener on this host (the protected-default tests). It needs
// root and the ip(8) tool; without them the test is skipped, saying why.
package vethtest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// Pair is a namespace and a veth pair: HostIP (on this side, in the
// test's namespace) and PeerIP (inside the namespace), both /24.
type Pair struct {
	Name           string
	HostIP, PeerIP string
}

var seq atomic.Uint32

// New creates a pair, removed when the test ends; it skips the test when
// the host cannot make one.
func New(t testing.TB) *Pair {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("vethtest: needs root to create a network namespace; skipping the end-to-end part")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("vethtest: no ip(8) on this host; skipping the end-to-end part")
	}
	n := seq.Add(1)
	tag := fmt.Sprintf("%d%d", os.Getpid()%100000, n%100)
	p := &Pair{Name: "crt" + tag}
	net3 := (os.Getpid()+int(n))%200 + 20
	p.HostIP, p.PeerIP = fmt.Sprintf("10.231.%d.1", net3), fmt.Sprintf("10.231.%d.2", net3)
	host, peer := "cvh"+tag, "cvp"+tag
	run := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
		return nil
	}
	if err := run("netns", "add", p.Name); err != nil {
		t.Skipf("vethtest: cannot create a network namespace (%v); skipping the end-to-end part", err)
	}
	t.Cleanup(func() {
		_ = run("link", "del", host)
		_ = run("netns", "del", p.Name)
	})
	for _, args := range [][]string{
		{"link", "add", host, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", p.Name},
		{"addr", "add", p.HostIP + "/24", "dev", host},
		{"link", "set", host, "up"},
		{"-n", p.Name, "addr", "add", p.PeerIP + "/24", "dev", peer},
		{"-n", p.Name, "link", "set", peer, "up"},
		{"-n", p.Name, "link", "set", "lo", "up"},
	} {
		if err := run(args...); err != nil {
			t.Skipf("vethtest: cannot set up the veth pair (%v); skipping the end-to-end part", err)
		}
	}
	return p
}

// Do runs f on an OS thread inside the namespace: sockets f creates (on
// its own goroutine: a net.Dial) belong to it, and keep working from any
// goroutine afterwards. The thread is never given back to the runtime
// (it exits with f's goroutine), so no other goroutine ends up inside.
// f must not call t.FailNow: return what it saw and check it after.
func (p *Pair) Do(t testing.TB, f func()) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		var err error
		defer func() { errc <- err }() // also if f ends the goroutine
		runtime.LockOSThread()
		var fd int
		if fd, err = unix.Open("/var/run/netns/"+p.Name, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err == nil {
			f()
		}
	}()
	if err := <-errc; err != nil {
		t.Fatalf("vethtest: entering %s: %v", p.Name, err)
	}
}
