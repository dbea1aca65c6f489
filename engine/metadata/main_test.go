package metadata

import (
	"flag"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// update rewrites the golden files under testdata/ instead of comparing.
var update = flag.Bool("update", false, "rewrite golden files in testdata/")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// openFDs counts this process's open file descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count fds: %v", err)
	}
	return len(ents)
}

// noFDLeak fails the test if, after its cleanups, more fds are open than
// at the call. Closes by exiting goroutines may lag a little.
func noFDLeak(t *testing.T) {
	before := openFDs(t)
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := openFDs(t)
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%d fds open, %d before the test", n, before)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
