package store

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/internal/testlog"
)

func TestMain(m *testing.M) {
	testlog.QuietDefault() // masters with a nil Logger log at info; children too
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	goleak.VerifyTestMain(m)
}
