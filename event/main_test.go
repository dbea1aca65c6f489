package event

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/internal/testsvc"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// python returns a Python interpreter that imports zmq and msgpack (the
// Debian packages python3-zmq and python3-msgpack).
func python(t testing.TB) string {
	t.Helper()
	return testsvc.Python(t, "import zmq, msgpack")
}
