package testutil

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"google.golang.org/protobuf/encoding/protowire"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/metadata"
)

// Fill writes a pseudo-random pattern determined by seed: the first
// len(b) bytes of seed's ChaCha8 stream, so a shorter fill is a prefix
// of a longer one. Tests fill megabytes, so it goes a block at a time: a
// byte per generator call cost about 38 ns a byte under -race.
func Fill(b []byte, seed uint64) {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	binary.LittleEndian.PutUint64(s[8:], seed^0x9e3779b97f4a7c15)
	rand.NewChaCha8(s).Read(b)
}

// Bytes is n bytes of Fill(seed).
func Bytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	Fill(b, seed)
	return b
}

// FirstDiff describes where got and want differ ("equal" when they don't).
func FirstDiff(got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Sprintf("byte %d of %d is %#x, want %#x", i, len(got), got[i], want[i])
		}
	}
	return "equal"
}

// Eventually polls f until it holds, failing the test after 20 s.
func Eventually(tb testing.TB, what string, f func() bool) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// CountFDs is the number of file descriptors the process has open.
func CountFDs(tb testing.TB) int {
	tb.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	return len(ents)
}

// Handshake is the engine's handshake as transports see it, over a real
// handshake server whose address is the segment name (P2P mode):
// Connection frames go straight to the peer's server.
type Handshake struct{ S *metadata.Server }

// Handle implements transport.Handshake.
func (h Handshake) Handle(p string, f func(json.RawMessage) (json.RawMessage, error)) {
	h.S.HandleProtocol(p, f)
}

// Exchange implements transport.Handshake.
func (h Handshake) Exchange(ctx context.Context, peer string, req []byte) ([]byte, error) {
	return metadata.Exchange(ctx, peer, metadata.Connection, req)
}

// Allocated is the bytes allocated on the heap while f ran.
func Allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// EmptyMessages is n empty protobuf messages in field num, two bytes
// each: the most a decoder can be made to build from the fewest bytes.
func EmptyMessages(num protowire.Number, n int) []byte {
	b := make([]byte, 0, 2*n)
	for range n {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, 0)
	}
	return b
}
