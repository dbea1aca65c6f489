package fabric_test

import (
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/internal/fabric"
)

// Some providers install SIGINT/SIGTERM handlers when they start; the
// shim puts the Go runtime's back, so os/signal still gets the signal.
// (Without that, the SIGTERM below ends the test binary with status 1.)
func TestSignalsStayWithGo(t *testing.T) {
	needFabric(t)
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM)
	defer signal.Reset(syscall.SIGTERM)
	// Ask for every provider, efa included (absent here, but loading the
	// providers is what installs their handlers).
	for _, p := range []string{"efa", "tcp;ofi_rxm", "sockets", ""} {
		fabric.Discover(p, 0)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not reach os/signal")
	}
}
