// Package fabrictest holds what the libfabric tests (internal/fabric,
// engine/transport/efa) share: which software providers they run on and
// which provider defects they skip.
package fabrictest

import (
	"os"
	"strings"
	"testing"
)

// Providers returns the providers a test runs on: CRESCENT_FI_PROVIDERS
// (comma-separated) when set, else defaults.
func Providers(defaults ...string) []string {
	if s := Override(); s != "" {
		return strings.Split(s, ",")
	}
	return defaults
}

// Override is CRESCENT_FI_PROVIDERS, the providers named explicitly.
func Override() string { return os.Getenv("CRESCENT_FI_PROVIDERS") }

// SkipBurstLoss skips a test that posts a burst of RMA writes on
// libfabric 1.17's sockets provider, which loses some of them (posted,
// never completed: about 1 run in 40 at transmit queues of 8 to 256, with
// or without EAGAIN; tcp;ofi_rxm and shm do not), unless
// CRESCENT_FI_PROVIDERS names providers explicitly.
func SkipBurstLoss(t testing.TB, prov string) {
	t.Helper()
	if prov == "sockets" && Override() == "" {
		t.Skip("the sockets provider loses writes in bursts; use tcp;ofi_rxm")
	}
}
