package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/bench"
)

// The table goes to stdout at the end; progress gets a line before the
// first run and one per run as it ends, with the elapsed time.
func TestTableProgress(t *testing.T) {
	var out, progress strings.Builder
	c := bench.TransferConfig{Threads: 1, BatchSize: 2, BufferSize: 4 << 20, Duration: 100 * time.Millisecond, Warmup: -1}
	require.NoError(t, runTable(context.Background(), c, []string{"shm"}, &out, &progress))
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	require.Len(t, lines, 5, progress.String())
	assert.Regexp(t, `^crescent-bench: 4 runs \(shm; write, read; 64 KiB, 1 MiB\) of at least 0s each \(warm-up, baseline, transfer; plus set-up\): at least 1s; the table follows on stdout$`, lines[0])
	for i, want := range []string{"shm write 64 KiB", "shm write 1 MiB", "shm read 64 KiB", "shm read 1 MiB"} {
		assert.Regexp(t, `^\[`+string(rune('1'+i))+`/4 \d+:\d\d, about \d+:\d\d left\] `+regexp.QuoteMeta(want)+`: [0-9.]+ GB/s, memcpy [0-9.]+ GB/s, ratio [0-9.]+$`, lines[i+1])
	}
	rows := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, rows, 5, out.String())
	assert.Contains(t, rows[0], "protocol")
	assert.NotContains(t, out.String(), "runs (", "progress stays off stdout")
}

func TestFmtElapsed(t *testing.T) {
	assert.Equal(t, "0:00", fmtElapsed(0))
	assert.Equal(t, "0:59", fmtElapsed(59*time.Second))
	assert.Equal(t, "2:05", fmtElapsed(125*time.Second+400*time.Millisecond))
}

// Initiator mode without --baseline_server says, once, that its
// baseline is local; with one it does not.
func TestInitiatorBaselineNote(t *testing.T) {
	run := func(args ...string) string {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--", "transfer", "--mode", "initiator", "--protocol", "tcp",
			"--segment_id", "127.0.0.1:1", "--duration", "0.1", "--warmup", "0", "--buffer_size", "4MiB"}, args...)...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		var errb strings.Builder
		cmd.Stderr = &errb
		err := cmd.Run()
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "nothing listens on 127.0.0.1:1: the run fails (%v)", err)
		return errb.String()
	}
	assert.Equal(t, 1, strings.Count(run(), baselineNote+"\n"))
	assert.NotContains(t, run("--baseline_server", "127.0.0.1:1"), baselineNote)
}
