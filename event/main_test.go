package event

import (
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// python returns a Python interpreter that imports zmq and msgpack (the
// Debian packages python3-zmq and python3-msgpack). Without one the test
// is skipped, or fails when CRESCENT_REQUIRE_DEPS=1 (make test).
func python(t testing.TB) string {
	t.Helper()
	for _, cand := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(cand)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import zmq, msgpack").Run() == nil {
			return path
		}
	}
	const msg = "python3 with modules zmq and msgpack not found (Debian python3-zmq python3-msgpack); run make deps"
	if os.Getenv("CRESCENT_REQUIRE_DEPS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
