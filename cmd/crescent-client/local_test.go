package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/local"
)

// Dummy processes: the test binary re-executed with dummyEnv set to a
// mode and dummySockEnv to the socket.
const (
	dummyEnv     = "CRESCENT_TEST_DUMMY"
	dummySockEnv = "CRESCENT_TEST_DUMMY_SOCKET"
)

func init() {
	if mode := os.Getenv(dummyEnv); mode != "" {
		os.Exit(runDummy(mode, os.Getenv(dummySockEnv)))
	}
}

func dummyVal(key string, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(len(key)*31 + i*7 + int(key[len(key)-1]))
	}
	return b
}

// runDummy is a dummy process's body; it reports on stdout.
func runDummy(mode, sock string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	say := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	d, err := local.Dial(ctx, sock)
	if mode == "probe" {
		if err != nil {
			say("refused: %v", err)
			return 0
		}
		say("registered")
		return 0
	}
	if err != nil {
		say("dial: %v", err)
		return 1
	}
	defer d.Close()
	switch mode {
	case "worker": // puts its keys and reads everyone's
		me := os.Getenv("CRESCENT_TEST_DUMMY_NAME")
		for i := range 10 {
			k := fmt.Sprintf("%s-%d", me, i)
			if err := d.Put(ctx, k, dummyVal(k, 64<<10+i), store.ReplicateConfig{}); err != nil {
				say("put %s: %v", k, err)
				return 1
			}
		}
		say("put done")
		bufio.NewReader(os.Stdin).ReadString('\n') // every worker has put its keys
		for range 3 {
			for _, who := range []string{"w0", "w1", "w2"} {
				for i := range 10 {
					k := fmt.Sprintf("%s-%d", who, i)
					b, err := d.GetBuffer(ctx, k)
					if err != nil {
						say("get %s: %v", k, err)
						return 1
					}
					if !bytes.Equal(b.Bytes(), dummyVal(k, 64<<10+i)) {
						say("get %s: wrong bytes", k)
						return 1
					}
					b.Release()
				}
			}
		}
		say("ok")
	case "hold": // holds a shared view until killed
		b, err := d.GetBuffer(ctx, os.Getenv("CRESCENT_TEST_DUMMY_NAME"))
		if err != nil {
			say("get: %v", err)
			return 1
		}
		say("holding shared=%v", b.Shared())
		select {}
	case "reconnect": // reads, waits for the real client's restart, reads again
		k := "persist"
		if err := d.Put(ctx, k, dummyVal(k, 1<<20), store.ReplicateConfig{}); err != nil {
			say("put: %v", err)
			return 1
		}
		for range 3 {
			b, err := d.GetBuffer(ctx, k)
			if err != nil {
				say("get: %v", err)
				return 1
			}
			b.Release()
		}
		say("phase1")
		bufio.NewReader(os.Stdin).ReadString('\n')
		for {
			err := d.Put(ctx, "after", dummyVal("after", 100), store.ReplicateConfig{})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				say("never reconnected: %v", err)
				return 1
			}
			time.Sleep(50 * time.Millisecond)
		}
		shared := false
		for range 3 {
			b, err := d.GetBuffer(ctx, "after")
			if err != nil {
				say("get after restart: %v", err)
				return 1
			}
			shared = shared || b.Shared()
			if !bytes.Equal(b.Bytes(), dummyVal("after", 100)) {
				say("wrong bytes after restart")
				return 1
			}
			b.Release()
		}
		say("phase2 shared=%v", shared)
	}
	return 0
}

// proc is a child process with its stdout as lines.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan error
	stdin io.WriteCloser
	url   string // crescent-client's metrics
}

func startProc(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	p := &proc{cmd: cmd, lines: make(chan string, 64), done: make(chan error, 1)}
	p.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			cmd.Process.Kill()
			<-p.done
		})
	})
	return p
}

func (p *proc) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatal("process output ended")
		}
		return l
	case <-time.After(60 * time.Second):
		t.Fatal("no output")
	}
	return ""
}

// expect reads lines until one starts with prefix.
func (p *proc) expect(t *testing.T, prefix string) string {
	t.Helper()
	for {
		if l := p.next(t); strings.HasPrefix(l, prefix) {
			return l
		} else if strings.Contains(l, ": ") && !strings.HasPrefix(l, "crescent-client:") {
			t.Fatalf("want %q, got %q", prefix, l)
		}
	}
}

func (p *proc) wait(t *testing.T) error {
	t.Helper()
	for range p.lines {
	}
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("process did not exit")
	}
	return nil
}

// startRealClient runs crescent-client with a local socket and a shared
// hot cache configured through the reference's environment variables.
func startRealClient(t *testing.T, tm *testMaster, sock string) *proc {
	t.Helper()
	args := []string{"--master_server_address", tm.addr, "--local_hostname", "127.0.0.1", "--global_segment_size", "32 MB",
		"--local_buffer_size", "8 MB", "--metrics_address", "127.0.0.1", "--metrics_port", "0", "--log_level", "error",
		"--local_socket", sock, "--local_socket_mode", "0666"}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), daemonEnv+"="+strings.Join(args, "\x1f"),
		local.EnvCacheSize+"=8mb", local.EnvBlockSize+"=2mb", local.EnvUseShm+"=1")
	p := startProc(t, cmd)
	p.expect(t, "crescent-client: segment")
	url := strings.TrimPrefix(p.expect(t, "crescent-client: metrics on "), "crescent-client: metrics on ")
	eventually(t, "the local socket", func() bool { _, err := os.Stat(sock); return err == nil })
	p.url = url
	return p
}

func startDummy(t *testing.T, sock, mode, name string, cred *syscall.Credential) *proc {
	t.Helper()
	bin := os.Args[0]
	if cred != nil {
		bin = worldExec(t)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), dummyEnv+"="+mode, dummySockEnv+"="+sock, "CRESCENT_TEST_DUMMY_NAME="+name)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	return startProc(t, cmd)
}

// worldExec copies the test binary where another uid may run it.
func worldExec(t *testing.T) string {
	t.Helper()
	dir := openDir(t)
	src, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	bin := filepath.Join(dir, "dummy.test")
	require.NoError(t, os.WriteFile(bin, src, 0o755))
	return bin
}

// openDir is a temporary directory other uids can enter.
func openDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "crescent-local-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	return dir
}

// TestLocalProcesses: a master, crescent-client with a local socket, and
// dummy processes: three put and read concurrently through the shared
// cache; one killed while it holds a view has its reference released;
// a dummy of another uid is refused; the metrics show it all.
func TestLocalProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if os.Getuid() != 0 {
		t.Skip("needs root to run a dummy as another uid")
	}
	tm := startMaster(t, "127.0.0.1:0")
	sock := filepath.Join(openDir(t), "crescent.sock")
	rc := startRealClient(t, tm, sock)
	url := rc.url

	var ws []*proc
	for i := range 3 {
		ws = append(ws, startDummy(t, sock, "worker", fmt.Sprintf("w%d", i), nil))
	}
	for _, w := range ws {
		w.expect(t, "put done")
	}
	for _, w := range ws {
		fmt.Fprintln(w.stdin)
	}
	for _, w := range ws {
		w.expect(t, "ok")
		require.NoError(t, w.wait(t))
	}

	h := startDummy(t, sock, "hold", "w1-3", nil)
	require.Equal(t, "holding shared=true", h.expect(t, "holding"))
	eventually(t, "the workers' sessions to end, the holder's view held", func() bool {
		_, body := httpGet(t, url+"/metrics")
		return strings.Contains(body, "crescent_local_dummies 1") && strings.Contains(body, "crescent_hot_cache_references 1")
	})
	require.NoError(t, h.cmd.Process.Signal(syscall.SIGKILL))
	h.wait(t)
	eventually(t, "the killed dummy's references to be released", func() bool {
		_, body := httpGet(t, url+"/metrics")
		return strings.Contains(body, "crescent_local_dummies 0") && strings.Contains(body, "crescent_hot_cache_references 0")
	})

	nobody := startDummy(t, sock, "probe", "", &syscall.Credential{Uid: 65534, Gid: 65534})
	l := nobody.expect(t, "refused")
	require.Contains(t, l, "ILLEGAL_CLIENT")
	require.Contains(t, l, "uid 65534")

	_, body := httpGet(t, url+"/metrics")
	for _, m := range []string{"crescent_hot_cache_hits_total", "crescent_hot_cache_admissions_total", "crescent_local_refused_total 1",
		"crescent_local_request_latency_seconds_count"} {
		require.True(t, strings.Contains(body, m), "/metrics lacks %q", m)
	}
	require.False(t, strings.Contains(body, "crescent_hot_cache_hits_total 0"), "no hot cache hits")
	_, sum := httpGet(t, url+"/metrics/summary")
	require.Contains(t, sum, "Hot cache:")
	require.Contains(t, sum, "Local dummies: 0 (refused 1")
}

// TestLocalRestart: the real client is killed and started again on the
// same socket; a dummy reconnects, registers anew and maps the new
// shared cache.
func TestLocalRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	tm := startMaster(t, "127.0.0.1:0")
	sock := filepath.Join(openDir(t), "crescent.sock")
	rc := startRealClient(t, tm, sock)
	d := startDummy(t, sock, "reconnect", "", nil)
	d.expect(t, "phase1")
	require.NoError(t, rc.cmd.Process.Signal(syscall.SIGKILL))
	rc.wait(t)
	rc2 := startRealClient(t, tm, sock)
	_ = rc2
	fmt.Fprintln(d.stdin)
	require.Equal(t, "phase2 shared=true", d.expect(t, "phase2"))
	require.NoError(t, d.wait(t))
}

// TestLocalFlags: the local flags over the environment, and their errors.
func TestLocalFlags(t *testing.T) {
	t.Setenv(local.EnvCacheSize, "64mb")
	t.Setenv(local.EnvUseShm, "1")
	o, err := parseFlags([]string{"--local_socket", "/tmp/x.sock", "--local_hot_block_size", "4MB", "--local_allow_uids", "1000, 1001",
		"--local_socket_mode", "0660"}, io.Discard)
	require.NoError(t, err)
	lo, err := o.local.localOpts(quiet)
	require.NoError(t, err)
	require.EqualValues(t, 64<<20, lo.CacheSize)
	require.EqualValues(t, 4<<20, lo.BlockSize)
	require.True(t, lo.Shm)
	require.Equal(t, []uint32{1000, 1001}, lo.AllowUIDs)
	require.EqualValues(t, 0o660, lo.SocketMode)
	o, err = parseFlags([]string{"--local_hot_cache_shm=false", "--local_hot_cache_size", "0"}, io.Discard)
	require.NoError(t, err)
	lo, err = o.local.localOpts(quiet)
	require.NoError(t, err)
	require.False(t, lo.Shm)
	require.Zero(t, lo.CacheSize)
	for _, args := range [][]string{
		{"--local_socket_mode", "999"}, {"--local_allow_uids", "root"}, {"--local_hot_cache_size", "big"}, {"--local_hot_block_size", "0"},
	} {
		o, err := parseFlags(args, io.Discard)
		require.NoError(t, err)
		_, err = o.local.localOpts(quiet)
		require.Error(t, err, "%v", args)
	}
	_, err = parseFlags([]string{"--local_hot_cache_shm=maybe"}, io.Discard)
	require.Error(t, err)
}

// TestLocalFlagsCheckedFirst: a bad local flag fails before the client
// starts (no master is even dialled).
func TestLocalFlagsCheckedFirst(t *testing.T) {
	err := run(context.Background(), []string{"--master_server_address", "127.0.0.1:1", "--local_socket", "/tmp/x.sock",
		"--local_socket_mode", "9"}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "--local_socket_mode")
}

// rawLocal speaks store/local's wire format by hand (doc.go), from this
// process to the real client's process.
type rawLocal struct {
	t   *testing.T
	c   *net.UnixConn
	tok [16]byte
}

func rawDial(t *testing.T, sock string) *rawLocal {
	c, err := net.Dial("unix", sock)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	r := &rawLocal{t: t, c: c.(*net.UnixConn)}
	r.send(1, 1, nil, binary.LittleEndian.AppendUint32(nil, 1), -1)
	st, body := r.recv()
	require.Zero(t, st)
	copy(r.tok[:], body[:16])
	return r
}

func (r *rawLocal) send(op byte, id uint64, tok []byte, body []byte, fd int) {
	b := binary.LittleEndian.AppendUint32(nil, uint32(28+len(body)))
	b = append(b, op, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, id)
	b = append(b, make([]byte, 16)...)
	copy(b[16:32], tok)
	b = append(b, body...)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	_, _, err := r.c.WriteMsgUnix(b, oob, nil)
	require.NoError(r.t, err)
}

// recv reads one reply (closing any descriptor that came with it).
func (r *rawLocal) recv() (status byte, body []byte) {
	r.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	hdr := make([]byte, 32)
	oob := make([]byte, 64)
	n, oobn, _, _, err := r.c.ReadMsgUnix(hdr, oob)
	require.NoError(r.t, err)
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			fds, _ := unix.ParseUnixRights(&m)
			for _, fd := range fds {
				unix.Close(fd)
			}
		}
	}
	_, err = io.ReadFull(r.c, hdr[n:])
	require.NoError(r.t, err)
	body = make([]byte, binary.LittleEndian.Uint32(hdr)-28)
	_, err = io.ReadFull(r.c, body)
	require.NoError(r.t, err)
	return hdr[5], body
}

func errCode(body []byte) int32 { return int32(binary.LittleEndian.Uint32(body)) }

// TestLocalProcessRefusals: against the real client's process, a
// forged token is refused and the connection closed, and a span past a
// registered buffer's end is refused.
func TestLocalProcessRefusals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	tm := startMaster(t, "127.0.0.1:0")
	sock := filepath.Join(openDir(t), "crescent.sock")
	startRealClient(t, tm, sock)

	r := rawDial(t, sock)
	forged := r.tok
	forged[0] ^= 1
	key := binary.LittleEndian.AppendUint32(nil, 1)
	key = append(key, 'k')
	r.send(9, 2, forged[:], key, -1) // Exist
	st, body := r.recv()
	require.EqualValues(t, 1, st)
	require.EqualValues(t, errcode.IllegalClient, errCode(body))
	_, err := r.c.Read(make([]byte, 1))
	require.Error(t, err, "still connected after a forged token")

	r = rawDial(t, sock)
	p, err := mempool.New(mempool.Options{Size: 1 << 20, Name: "raw"})
	require.NoError(t, err)
	defer p.Close()
	r.send(3, 3, r.tok[:], binary.LittleEndian.AppendUint64(nil, 1<<20), p.Fd()) // Register
	st, body = r.recv()
	require.Zero(t, st, "register: %x", body)
	region := binary.LittleEndian.Uint32(body)
	get := append(append([]byte(nil), key...), 1) // Get into region ref
	get = binary.LittleEndian.AppendUint32(get, region)
	get = binary.LittleEndian.AppendUint64(get, 1<<20-8)
	get = binary.LittleEndian.AppendUint64(get, 16)
	r.send(6, 4, r.tok[:], get, -1)
	st, body = r.recv()
	require.EqualValues(t, 1, st)
	require.EqualValues(t, errcode.InvalidParams, errCode(body))
	require.Contains(t, string(body), "outside buffer")
	r.send(2, 5, r.tok[:], nil, -1) // still registered: Ping answers
	st, _ = r.recv()
	require.Zero(t, st)
}
