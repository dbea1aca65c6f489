package service

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/storepb"
)

// pyPhase is one phase of testdata/grpc_peer.py.
type pyPhase struct {
	Method   string   `json:"method"`
	Requests [][]byte `json:"requests"` // base64 in JSON
	Workers  int      `json:"workers"`
}

// existRequest is a BatchExistKey request for keys and about pad bytes
// more of padding keys of up to keyLen bytes: the reply says which
// exist, so a request cut or corrupted on the way shows.
func existRequest(t *testing.T, keys []string, pad, keyLen int) []byte {
	ks := append([]string{}, keys...)
	for i := 0; pad > 0; i++ {
		n := min(pad, keyLen)
		ks = append(ks, strings.Repeat(string(rune('a'+i%26)), n))
		pad -= n + 3
	}
	b, err := proto.Marshal(&storepb.BatchExistKeyRequest{Keys: ks})
	require.NoError(t, err)
	return b
}

// checkExistReply checks a BatchExistKey reply to a request of
// existRequest({"present", "absent"}, ...) with n keys (-1: any).
func checkExistReply(t *testing.T, raw []byte, n int) {
	var rep storepb.BatchExistKeyResponse
	require.NoError(t, proto.Unmarshal(raw, &rep))
	if n >= 0 {
		require.Len(t, rep.GetResults(), n)
	}
	require.GreaterOrEqual(t, len(rep.GetResults()), 2)
	require.Zero(t, rep.GetResults()[0].GetErrorCode(), "present")
	require.True(t, rep.GetResults()[0].GetExists(), "present")
	require.False(t, rep.GetResults()[1].GetExists(), "absent")
}

// runPyPeer makes the phases' calls from gRPC C-core and returns each
// phase's result lines.
func runPyPeer(t *testing.T, addr string, phases []pyPhase) [][]string {
	py := testsvc.Python(t, "import grpc")
	in, err := json.Marshal(phases)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "grpc_peer.py"), addr)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "grpc_peer.py: %s", stderr.String())
	var res [][]string
	var cur []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "phase" {
			res, cur = append(res, cur), nil
			continue
		}
		cur = append(cur, line)
	}
	require.Len(t, res, len(phases))
	return res
}

// TestGRPCBoundWithCCore: the request byte bound's frame walk against
// another HTTP/2 implementation (gRPC C-core, through Python): calls of
// every size pass it byte for byte and answer right, one at a time and
// eight at once; past the bound, concurrent 1 MiB calls on one
// connection are answered or refused (UNAVAILABLE), never stalled, and
// every byte comes back.
func TestGRPCBoundWithCCore(t *testing.T) {
	e := mastertest.New(t, nil)
	const bound = 4 << 20
	addr, svc := serveBounded(t, e, bound, 3*time.Second)
	keys := []string{"present", "absent"}
	c := mastertest.Client(1)
	e.Mount(c, "seg", 64<<20)
	e.Put(c, "present", 4096, master.ReplicateConfig{Replicas: 1})

	exist := func(pad int) []byte { return existRequest(t, keys, pad, 200) }
	var small, large [][]byte
	for i := range 40 {
		small = append(small, exist(i*i*97))
	}
	for range 16 {
		large = append(large, exist(1<<20))
	}
	// Answers of 20 KB, 480 KB in all on one connection: far past the
	// windows C-core starts with, so h2bound must follow its updates.
	var wide [][]byte
	for range 24 {
		wide = append(wide, existRequest(t, keys, (storepb.MaxBatchItems-2)*4, 1))
	}
	const method = "/crescent.store.v1.Master/BatchExistKey"
	res := runPyPeer(t, addr, []pyPhase{
		{Method: method, Requests: small, Workers: 1},
		{Method: method, Requests: small, Workers: 8},
		{Method: method, Requests: large, Workers: 16},
		{Method: method, Requests: small[:4], Workers: 1},
		{Method: method, Requests: wide, Workers: 8},
	})
	// check checks an answer line with n results (-1: any).
	check := func(line string, n int) {
		rest, ok := strings.CutPrefix(line, "ok ")
		require.True(t, ok, line)
		raw, err := base64.StdEncoding.DecodeString(rest)
		require.NoError(t, err)
		checkExistReply(t, raw, n)
	}
	for _, ph := range [][]string{res[0], res[1], res[3]} {
		for _, line := range ph {
			check(line, -1)
		}
	}
	ok := 0
	for _, line := range res[2] {
		if strings.HasPrefix(line, "err ") {
			// REFUSED_STREAM is error code 7.
			require.Equal(t, "err UNAVAILABLE Received RST_STREAM with error code 7", line)
			continue
		}
		check(line, -1)
		ok++
	}
	require.Positive(t, ok)
	require.Len(t, res[4], len(wide))
	for _, line := range res[4] {
		check(line, storepb.MaxBatchItems)
	}
	require.Zero(t, svc.GRPCWindowsStarved(), "a window C-core opened was seen shut")
	b := svc.h2.Load()
	require.LessOrEqual(t, b.Peak(), int64(bound))
	require.Eventually(t, func() bool { return b.Held() == 0 }, 10*time.Second, 10*time.Millisecond, "held %d", b.Held())
	t.Logf("large calls: %d answered, %d refused", ok, len(res[2])-ok)
}
