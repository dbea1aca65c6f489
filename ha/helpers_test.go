package ha

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store/master"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testsvc.GoleakIgnores()...) }

const wait = 30 * time.Second

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

func newClock() *clock.Fake { return clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)) }

func dump(t testing.TB, m *master.Master) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, m.DumpState(&b))
	return b.String()
}

// newReplica is an empty, unstarted master to follow a log into.
func newReplica(t testing.TB, clk *clock.Fake) *master.Master {
	t.Helper()
	m, err := master.New(master.Config{Shards: 3, Clock: clk, Seed: 99})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}
