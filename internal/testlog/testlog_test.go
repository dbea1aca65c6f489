package testlog

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("TESTLOG_CHILD") == "1" {
		QuietDefault() // exits 2 on a bad level
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// Capture keeps records at every level with their attributes, those of
// WithAttrs and group-qualified keys; Take forgets what it returned.
func TestCapture(t *testing.T) {
	c := &Capture{}
	l := slog.New(c)
	l.Debug("put", "key", "k", "size", 4096)
	l.With("client", "a").WithGroup("seg").Info("mounted", "id", 7)
	l.Warn("slow", "ms", 12)

	recs := c.Records()
	require.Len(t, recs, 3)
	assert.Equal(t, slog.LevelDebug, recs[0].Level)

	got := c.Take("mounted")
	require.Len(t, got, 1)
	assert.Equal(t, Line{Level: slog.LevelInfo, Attrs: map[string]any{"client": "a", "seg.id": int64(7)}}, got[0])
	assert.Empty(t, c.Records(), "Take forgets every record")

	l.Info("one", "peer", "10.0.0.1")
	l.Info("two", "other", "x")
	m := c.Mentioning("peer=10.0.0.1")
	require.Len(t, m, 1)
	assert.Equal(t, "one", m[0].Message)
	assert.Len(t, c.Mentioning("two"), 1, "the message counts")
	assert.Empty(t, c.Take("absent"))
}

// Loggers derived from one Capture write to it from many goroutines.
func TestCaptureConcurrent(t *testing.T) {
	c := &Capture{}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := slog.New(c).With("g", i)
			for range 100 {
				l.Info("x")
			}
		}()
	}
	wg.Wait()
	assert.Len(t, c.Take("x"), 800)
}

// QuietDefault: warn unless CRESCENT_TEST_LOG asks for more; the log
// package still writes where it wrote.
func TestQuietDefault(t *testing.T) {
	old, oldOut, oldFlags := slog.Default(), log.Writer(), log.Flags()
	t.Cleanup(func() {
		slog.SetDefault(old)
		log.SetOutput(oldOut)
		log.SetFlags(oldFlags)
	})
	var buf bytes.Buffer
	log.SetOutput(&buf)
	log.SetFlags(0)
	ctx := context.Background()

	t.Setenv(LevelEnv, "")
	QuietDefault()
	assert.False(t, slog.Default().Enabled(ctx, slog.LevelInfo))
	assert.True(t, slog.Default().Enabled(ctx, slog.LevelWarn))
	log.Print("from log")
	assert.Equal(t, "from log\n", buf.String(), "the log package is not routed through slog")

	for env, lowest := range map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "ERROR": slog.LevelError} {
		t.Setenv(LevelEnv, env)
		QuietDefault()
		assert.True(t, slog.Default().Enabled(ctx, lowest), env)
		assert.False(t, slog.Default().Enabled(ctx, lowest-1), env)
	}
}

func TestQuietDefaultBadLevel(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TESTLOG_CHILD=1", LevelEnv+"=loud")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 2, ee.ExitCode())
	assert.Contains(t, string(out), `CRESCENT_TEST_LOG="loud": want debug, info, warn or error`)
}
