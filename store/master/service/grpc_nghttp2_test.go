package service

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/storepb"
)

// notProcessed is nghttp's report of requests that got no answer.
var notProcessed = regexp.MustCompile(`Some requests were not processed\. total=(\d+), processed=(\d+)`)

// nghttp makes n concurrent calls of method with request req on one
// HTTP/2 connection from nghttp2's client (Debian nghttp2-client) and
// returns the answered calls' replies. Each reply must fit one DATA
// frame, so that replies do not interleave in nghttp's output.
func nghttp(t *testing.T, addr, method string, req []byte, n int) [][]byte {
	out, processed := nghttpRaw(t, addr, method, req, n)
	// The replies: gRPC messages (flag, 4-byte length, body) back to back.
	var replies [][]byte
	for len(out) > 0 {
		require.GreaterOrEqual(t, len(out), 5, "a cut reply")
		l := int(binary.BigEndian.Uint32(out[1:5]))
		require.Zero(t, out[0], "compressed reply")
		require.GreaterOrEqual(t, len(out), 5+l, "a cut reply")
		replies = append(replies, out[5:5+l])
		out = out[5+l:]
	}
	require.Len(t, replies, processed, "a reply per processed call")
	return replies
}

// nghttpRaw is nghttp's output (the answered calls' DATA, in the order
// it came) and how many calls were answered.
func nghttpRaw(t *testing.T, addr, method string, req []byte, n int) ([]byte, int) {
	bin, err := exec.LookPath("nghttp")
	if err != nil {
		testsvc.MissingDep(t, "nghttp (Debian nghttp2-client)", err)
	}
	body := filepath.Join(t.TempDir(), "req")
	msg := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(req))), req...)
	require.NoError(t, os.WriteFile(body, msg, 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-m", strconv.Itoa(n), "-d", body,
		"-H", "content-type: application/grpc", "-H", "te: trailers", "http://"+addr+method)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "nghttp: %s", stderr.String())
	processed := n
	if m := notProcessed.FindSubmatch(stderr.Bytes()); m != nil {
		processed, _ = strconv.Atoi(string(m[2]))
		require.Equal(t, strconv.Itoa(n), string(m[1]))
	} else {
		require.Empty(t, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, processed
}

// TestGRPCBoundWithNghttp2: the gRPC byte bound against a third HTTP/2
// implementation, nghttp2's (beside grpc-go's and C-core's): concurrent
// calls on one connection pass it byte for byte and are answered right;
// past the bound, the calls not answered were refused (REFUSED_STREAM,
// which nghttp reports as not processed), and every byte comes back.
func TestGRPCBoundWithNghttp2(t *testing.T) {
	e := mastertest.New(t, nil)
	const bound = 4 << 20
	addr, svc := serveBounded(t, e, bound, 3*time.Second)
	c := mastertest.Client(1)
	e.Mount(c, "seg", 64<<20)
	e.Put(c, "present", 4096, master.ReplicateConfig{Replicas: 1})
	keys := []string{"present", "absent"}
	held := func() int64 { h, _ := svc.GRPCRequestBytes(); return h }
	refused := func() int64 { _, r := svc.GRPCRequestBytes(); return r }
	const method = storepb.Master_BatchExistKey_FullMethodName

	// Eight calls of 200 KB at once: within the bound, all answered.
	req := existRequest(t, keys, 200<<10, 1000)
	nkeys := func(req []byte) int {
		var r storepb.BatchExistKeyRequest
		require.NoError(t, r.UnmarshalVT(req))
		return len(r.GetKeys())
	}
	for _, r := range nghttp(t, addr, method, req, 8) {
		checkExistReply(t, r, nkeys(req))
	}
	require.Zero(t, refused())

	// Sixteen of 1 MiB over the 4 MiB bound: some answered, the rest
	// refused, none lost (again, up to five times, until the bound was
	// reached: nghttp's interleaving is its own).
	req = existRequest(t, keys, 1<<20, 1000)
	for attempt := 0; attempt < 5 && refused() == 0; attempt++ {
		replies := nghttp(t, addr, method, req, 16)
		require.NotEmpty(t, replies)
		for _, r := range replies {
			checkExistReply(t, r, nkeys(req))
		}
		require.EqualValues(t, 16-len(replies), refused(), "every call not answered was refused")
		require.Eventually(t, func() bool { return held() == 0 }, 10*time.Second, 10*time.Millisecond, "held %d", held())
		t.Logf("%d of 16 answered", len(replies))
	}
	require.Positive(t, refused(), "the bound was never reached: the test proves nothing")

	// Twenty calls at once on one connection whose answers of 20 KB add
	// up to six times the 64 KiB windows nghttp starts with: all answered
	// in full, so h2bound followed nghttp2's window updates. (The answers
	// interleave in nghttp's output, split where a window ran out: all
	// alike, they add up to twenty times one.)
	req = existRequest(t, keys, (storepb.MaxBatchItems-2)*4, 1)
	one := nghttp(t, addr, method, req, 1)
	require.Len(t, one, 1)
	checkExistReply(t, one[0], nkeys(req))
	out, processed := nghttpRaw(t, addr, method, req, 20)
	require.Equal(t, 20, processed)
	require.Len(t, out, 20*(5+len(one[0])))
	require.Zero(t, svc.GRPCWindowsStarved(), "a window nghttp2 opened was seen shut")
	require.LessOrEqual(t, svc.h2.Load().Peak(), int64(bound))
}
