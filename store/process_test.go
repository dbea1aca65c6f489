package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// End to end with separate OS processes on loopback: the master is the
// crescent-master binary, built into a temporary directory (or, when it
// cannot be built, this test binary re-executed as a master: store/master
// and its gRPC service); clients are this test binary re-executed as a
// client driven by lines on stdin.

const childEnv = "CRESCENT_STORE_CHILD"

// runChild is the child's main; it returns the exit code.
func runChild(mode string) int {
	var err error
	switch mode {
	case "master":
		err = childMaster()
	case "client":
		err = childClient()
	default:
		err = fmt.Errorf("unknown child mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// childMaster serves a master until SIGTERM or stdin closes.
func childMaster() error {
	ttl, err := time.ParseDuration(os.Getenv("CRESCENT_CHILD_CLIENT_TTL"))
	if err != nil {
		return err
	}
	m, err := master.New(master.Config{ClientTTL: ttl, LivenessInterval: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	if err := m.Start(); err != nil {
		return err
	}
	defer m.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	g := grpc.NewServer()
	service.New(m).Register(g)
	go g.Serve(lis)
	defer g.Stop()
	fmt.Printf("ADDR %s\n", lis.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	<-ctx.Done()
	return nil
}

// childClient runs a client and answers commands, one line each:
//
//	put KEY SIZE SEED REPLICAS PREFERRED|-   -> ok | err CODE
//	get KEY SIZE SEED                        -> ok | err CODE (bytes checked)
func childClient() error {
	ctx := context.Background()
	c, err := New(ctx, Config{
		MasterAddr: os.Getenv("CRESCENT_CHILD_MASTER"), LocalHostname: "127.0.0.1",
		GlobalSegmentSize: 32 << 20, LocalBufferSize: 8 << 20, HeartbeatInterval: 200 * time.Millisecond, Logger: quiet,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("NAME %s\n", c.SegmentName())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		var reply string
		switch {
		case f[0] == "put" && len(f) == 6:
			size, _ := strconv.Atoi(f[2])
			seed, _ := strconv.ParseUint(f[3], 10, 64)
			n, _ := strconv.Atoi(f[4])
			rc := ReplicateConfig{Replicas: n}
			if f[5] != "-" {
				rc.Preferred = []string{f[5]}
			}
			reply = result(c.Put(ctx, f[1], testutil.Bytes(size, seed), rc))
		case f[0] == "get" && len(f) == 4:
			size, _ := strconv.Atoi(f[2])
			seed, _ := strconv.ParseUint(f[3], 10, 64)
			got, err := c.Get(ctx, f[1])
			if err == nil && !bytes.Equal(got, testutil.Bytes(size, seed)) {
				reply = "err MISMATCH"
			} else {
				reply = result(err)
			}
		default:
			reply = "err BAD_COMMAND"
		}
		fmt.Println(reply)
	}
	return nil
}

func result(err error) string {
	if err == nil {
		return "ok"
	}
	return "err " + errcode.CodeOf(err).String()
}

// child is a re-executed test binary.
type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	name  string
	first string // the value of the first line's tag
}

func startChild(t *testing.T, mode string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+mode), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out), name: mode}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	line := c.line()
	_, c.first, _ = strings.Cut(line, " ")
	return c
}

func (c *child) line() string {
	c.t.Helper()
	if !c.out.Scan() {
		c.t.Fatalf("%s: no output (%v)", c.name, c.out.Err())
	}
	return c.out.Text()
}

func (c *child) do(format string, args ...any) string {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.in, format+"\n", args...); err != nil {
		c.t.Fatalf("%s: %v", c.name, err)
	}
	return c.line()
}

// stop closes stdin and expects a clean exit.
func (c *child) stop() {
	c.t.Helper()
	c.in.Close()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			c.t.Fatalf("%s exited: %v", c.name, err)
		}
	case <-time.After(60 * time.Second):
		c.t.Fatalf("%s did not exit", c.name)
	}
}

// TestProcesses: a master and two clients as separate processes. Values
// put on one are read on the other; then one client is killed (SIGKILL)
// and, after the master's client TTL, the keys stored only there are
// OBJECT_NOT_FOUND while keys with a replica elsewhere stay readable and
// the surviving client keeps working.
func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	m := startMasterProcess(t)
	addr := m.first
	c1 := startChild(t, "client", "CRESCENT_CHILD_MASTER="+addr)
	c2 := startChild(t, "client", "CRESCENT_CHILD_MASTER="+addr)
	c1.name, c2.name = "client 1", "client 2"
	type obj struct {
		key        string
		size, seed int
	}
	var only1, only2, both []obj
	for i, size := range []int{1, 4096, 100000, 2 << 20} {
		only1 = append(only1, obj{fmt.Sprintf("only1-%d", i), size, 10 + i})
		only2 = append(only2, obj{fmt.Sprintf("only2-%d", i), size, 20 + i})
		both = append(both, obj{fmt.Sprintf("both-%d", i), size, 30 + i})
	}
	put := func(o obj, n int, pref string) {
		if r := c1.do("put %s %d %d %d %s", o.key, o.size, o.seed, n, pref); r != "ok" {
			t.Fatalf("put %s: %s", o.key, r)
		}
	}
	for i := range only1 {
		put(only1[i], 1, c1.first)
		put(only2[i], 1, c2.first) // written by client 1 into client 2's memory
		put(both[i], 2, "-")
	}
	get := func(c *child, o obj) string { return c.do("get %s %d %d", o.key, o.size, o.seed) }
	for _, set := range [][]obj{only1, only2, both} {
		for _, o := range set {
			for _, c := range []*child{c2, c1} {
				if r := get(c, o); r != "ok" {
					t.Fatalf("%s: get %s: %s", c.name, o.key, r)
				}
			}
		}
	}
	// A third reader in this process, through the same master.
	tm := &testMaster{addr: addr}
	reader := newTestClient(t, tm, 0)
	if got, err := reader.Get(tctx(t), both[3].key); err != nil || !bytes.Equal(got, testutil.Bytes(both[3].size, uint64(both[3].seed))) {
		t.Fatalf("in-process reader: %v", err)
	}

	if err := c1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c1.cmd.Wait()
	eventually(t, "client 1's replicas to go", func() bool {
		return get(c2, only1[0]) == "err OBJECT_NOT_FOUND"
	})
	for _, o := range only1 {
		if r := get(c2, o); r != "err OBJECT_NOT_FOUND" {
			t.Fatalf("get %s stored only on the dead client: %s", o.key, r)
		}
	}
	for _, set := range [][]obj{only2, both} {
		for _, o := range set {
			if r := get(c2, o); r != "ok" {
				t.Fatalf("get %s after client 1 died: %s", o.key, r)
			}
		}
	}
	if _, err := reader.Get(tctx(t), only1[1].key); !errors.Is(err, errcode.ErrObjectNotFound) {
		t.Fatalf("in-process reader, dead client's key: %v", err)
	}
	// The survivor keeps working: new puts land on the live segment.
	n := obj{"after", 300000, 99}
	if r := c2.do("put %s %d %d 2 -", n.key, n.size, n.seed); r != "ok" {
		t.Fatalf("put after: %s", r)
	}
	if r := get(c2, n); r != "ok" {
		t.Fatalf("get after: %s", r)
	}
	if got, err := reader.Get(tctx(t), n.key); err != nil || len(got) != n.size {
		t.Fatalf("in-process reader after: %v", err)
	}
	c2.stop()
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	m.stop()
}

// startMasterProcess runs crescent-master (client TTL 1 s) and returns it
// with its gRPC address in first.
func startMasterProcess(t *testing.T) *child {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "crescent-master")
	gobin, err := exec.LookPath("go")
	if err == nil {
		build := exec.Command(gobin, "build", "-o", bin, "github.com/crescent-kv/crescent/cmd/crescent-master")
		var out []byte
		if out, err = build.CombinedOutput(); err != nil {
			err = fmt.Errorf("%w: %s", err, out)
		}
	}
	if err != nil {
		t.Logf("crescent-master not built (%v); running store/master in a child process", err)
		return startChild(t, "master", "CRESCENT_CHILD_CLIENT_TTL=1s")
	}
	cmd := exec.Command(bin, "--rpc_address", "127.0.0.1", "--rpc_port", "0", "--metrics_port", "0", "--client_ttl", "1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	errOut, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, cmd: cmd, in: in, out: bufio.NewScanner(errOut), name: "crescent-master"}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	for c.first == "" {
		line := c.line() // its log: ... msg="crescent-master serving" rpc=HOST:PORT ...
		if !strings.Contains(line, "crescent-master serving") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if a, ok := strings.CutPrefix(f, "rpc="); ok {
				c.first = a
			}
		}
	}
	go io.Copy(io.Discard, errOut) // keep its log flowing
	return c
}
