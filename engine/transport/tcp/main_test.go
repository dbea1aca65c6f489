package tcp_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves goroutines behind. It is the only
// TestMain of this package's tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
