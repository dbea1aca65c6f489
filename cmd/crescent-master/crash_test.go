package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

// childEnv makes the test binary run main instead of the tests (the
// crash test's master process).
const childEnv = "CRESCENT_MASTER_TEST_CHILD"

// masterProc is a crescent-master child process.
type masterProc struct {
	cmd     *exec.Cmd
	lines   chan string   // its stderr, line by line; closed at EOF
	done    chan struct{} // closed once it exited; then waitErr is set
	waitErr error
	stderr  bytes.Buffer
}

// startMaster runs crescent-master with args and waits until it serves;
// it returns the process and its "recovered" log line.
func startMaster(t *testing.T, args ...string) (*masterProc, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	pipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &masterProc{cmd: cmd, lines: make(chan string, 64), done: make(chan struct{})}
	var mu sync.Mutex
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default: // nobody is looking for more lines
			}
		}
		close(p.lines)
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill() // a no-op once it exited
		<-p.done
	})
	recovered := ""
	for line := range p.lines {
		if strings.Contains(line, "recovered from the operation log") {
			recovered = line
		}
		if strings.Contains(line, "crescent-master serving") {
			return p, recovered
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Fatalf("crescent-master exited before serving:\n%s", p.stderr.String())
	return nil, ""
}

// kill9 kills the master with SIGKILL and waits for it.
func (p *masterProc) kill9(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	go func() {
		for range p.lines {
		}
	}()
	<-p.done
	var ee *exec.ExitError
	require.ErrorAs(t, p.waitErr, &ee)
	require.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())
}

// crashValue is key's value: 512 B to 16.5 KiB determined by the key.
func crashValue(key string) []byte {
	h := fnv.New32a()
	h.Write([]byte(key))
	seed := uint64(len(key))<<32 | uint64(h.Sum32())
	return testutil.Bytes(512+int(seed%(16<<10)), seed)
}

// TestCrashRecovery: a durable master (--data_dir) under put/remove load
// from a real store.Client is killed with SIGKILL at random moments and
// restarted on the same directory and port. After each restart every
// acknowledged put is readable with its exact content through the same
// client (which keeps its memory and segment across the restart), and
// no acknowledged remove came back. An op whose RPC failed with the
// master (its outcome unknown) is not checked, and its key is not used
// again.
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	// Two at a time (-parallel defaults to GOMAXPROCS): each waits on its
	// child master and client round trips much of the time.
	t.Parallel()
	runCrashRecovery(t, crashRounds)
}

// crashRounds is how many times the harness kills the master; the
// snapshot variants, which add snapshots to what it already covers,
// kill half as often to keep the suite's time.
const crashRounds = 20

// runCrashRecovery is TestCrashRecovery with extra master flags; it
// returns the "recovered" log line of every restart.
func runCrashRecovery(t *testing.T, rounds int, extra ...string) []string {
	return crashRecovery(t, rounds, append([]string{"--data_dir", t.TempDir()}, extra...)...)
}

// crashRecovery is TestCrashRecovery's harness over the log logArgs
// configure (and any other flags), killing the master rounds times; it
// returns the "recovered" log line of every restart.
func crashRecovery(t *testing.T, rounds int, logArgs ...string) []string {
	var lines []string
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CRASH_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (CRASH_SEED)", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	port := testsvc.FreePort(t)
	// A forced remove is an admin operation: without the admin token every
	// remove failed and no acknowledged remove was ever checked.
	admin := adminArgs(t)
	args := append([]string{"--rpc_address", "127.0.0.1", "--rpc_port", strconv.Itoa(port), "--metrics_port", "0",
		"--client_ttl", "60", "--log_level", "info"}, append(admin, logArgs...)...)
	proc, recovered := startMaster(t, args...)
	require.Contains(t, recovered, "entries=0")

	ctx := context.Background()
	cl, err := store.New(ctx, store.Config{MasterAddr: "127.0.0.1:" + strconv.Itoa(port), GlobalSegmentSize: 64 << 20,
		LocalBufferSize: 16 << 20, Protocols: []string{"tcp"}, LocalHostname: "127.0.0.1", RPCTimeout: 2 * time.Second,
		HeartbeatInterval: 200 * time.Millisecond, PutRetries: -1, AdminTokenFile: admin[1],
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer cl.Close()

	var (
		mu      sync.Mutex
		acked   = map[string]bool{} // put acknowledged, not removed
		removed = map[string]bool{} // remove acknowledged
		unsure  = map[string]bool{} // put answered with an error
		next    atomic.Int64
	)
	rc := store.ReplicateConfig{Replicas: 1}
	const workers = 4
	totalAcked := 0
	for round := range rounds {
		killAt := int64(100 + r.IntN(400))
		var ops atomic.Int64
		reached := make(chan struct{})
		wctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for w := range workers {
			wr := rand.New(rand.NewPCG(seed, uint64(round*workers+w+2)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				count := func() { // an op was sent
					if ops.Add(1) == killAt {
						close(reached)
					}
				}
				for wctx.Err() == nil {
					if wr.IntN(4) == 0 {
						var victim string
						mu.Lock()
						for k := range acked { // any acknowledged key
							victim = k
							break
						}
						delete(acked, victim) // uncertain until answered
						mu.Unlock()
						if victim == "" {
							continue
						}
						count()
						err := cl.Remove(wctx, victim, true)
						mu.Lock()
						switch {
						case err == nil:
							removed[victim] = true
						case errors.Is(err, errcode.ErrObjectNotFound):
							t.Errorf("acknowledged key %s not found at remove: %v", victim, err)
						}
						mu.Unlock()
						continue
					}
					key := fmt.Sprintf("r%d/k%d", round, next.Add(1))
					count()
					err := cl.Put(wctx, key, crashValue(key), rc)
					mu.Lock()
					if err == nil {
						acked[key] = true
					} else {
						unsure[key] = true
					}
					mu.Unlock()
				}
			}()
		}
		// Kill at a random op count, with ops in flight.
		<-reached
		proc.kill9(t)
		stop()
		wg.Wait()

		proc, recovered = startMaster(t, args...)
		t.Logf("round %d: killed after %d ops; %s", round, ops.Load(), recovered)
		lines = append(lines, recovered)
		require.Contains(t, recovered, "entries=")

		mu.Lock()
		keys := make([]string, 0, len(acked))
		for k := range acked {
			keys = append(keys, k)
		}
		gone := make([]string, 0, len(removed))
		for k := range removed {
			gone = append(gone, k)
		}
		mu.Unlock()
		totalAcked += len(keys)
		require.NotEmpty(t, keys, "round %d acknowledged no put: the test proves nothing", round)
		vals, errs := getAllRetry(ctx, cl, keys)
		for i, k := range keys {
			require.NoError(t, errs[i], "round %d: acknowledged key %s", round, k)
			require.True(t, bytes.Equal(crashValue(k), vals[i]), "round %d: key %s content differs", round, k)
		}
		_, errs = getAllRetry(ctx, cl, gone)
		for i, k := range gone {
			require.ErrorIs(t, errs[i], errcode.ErrObjectNotFound, "round %d: removed key %s came back", round, k)
		}
		// A put that was not acknowledged is there whole or not at all.
		mu.Lock()
		maybe := make([]string, 0, len(unsure))
		for k := range unsure {
			maybe = append(maybe, k)
			delete(unsure, k)
		}
		mu.Unlock()
		vals, errs = getAllRetry(ctx, cl, maybe)
		for i, k := range maybe {
			if errs[i] == nil {
				require.True(t, bytes.Equal(crashValue(k), vals[i]), "round %d: unacknowledged key %s half-visible", round, k)
			}
		}
	}
	require.NotEmpty(t, removed, "no remove was acknowledged: the test proves nothing about removes")
	t.Logf("%d rounds, %d acknowledged puts checked (summed over rounds), %d removes; the client remounted %d times",
		rounds, totalAcked, len(removed), cl.Stats().Remounts)
	require.NoError(t, cl.Close())
	proc.cmd.Process.Signal(syscall.SIGTERM)
	return lines
}

// getAllRetry reads keys with BatchGet, 128 a call, retrying a call while
// the restarted master is not reachable yet (as getRetry does).
func getAllRetry(ctx context.Context, cl *store.Client, keys []string) ([][]byte, []error) {
	vals, errs := make([][]byte, 0, len(keys)), make([]error, 0, len(keys))
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), 128)]
		keys = keys[len(chunk):]
		deadline := time.Now().Add(20 * time.Second)
		for {
			vs, es := cl.BatchGet(ctx, chunk)
			retry := false
			for _, err := range es {
				retry = retry || unreachable(err)
			}
			if !retry || time.Now().After(deadline) {
				vals, errs = append(vals, vs...), append(errs, es...)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return vals, errs
}

// getRetry reads key, retrying while the restarted master is not
// reachable yet (its port is open once it logged "serving", but the
// client's connection redials on its own schedule).
func getRetry(ctx context.Context, cl *store.Client, key string) ([]byte, error) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := cl.Get(ctx, key)
		if err == nil || errors.Is(err, errcode.ErrObjectNotFound) || time.Now().After(deadline) {
			return v, err
		}
		if !unreachable(err) {
			return v, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unreachable reports whether err means the master did not answer (yet).
func unreachable(err error) bool {
	return errors.Is(err, errcode.ErrRPCFail) || errors.Is(err, errcode.ErrRPCTimeout)
}
