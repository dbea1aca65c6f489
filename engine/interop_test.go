package engine_test

// Interop with an independent Mooncake peer: testdata/mooncake_peer.py
// speaks the reference's P2P handshake, descriptor and TCP framing,
// written from the reference's formats rather than from Crescent's code.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/internal/testsvc"
)

// interopWait bounds every "eventually" step; generous for a loaded
// 2-core machine (the peer is CPython).
const interopWait = 60 * time.Second

// python3 returns the interpreter the peer needs (standard library only).
func python3(t *testing.T) string {
	t.Helper()
	return testsvc.Python(t, "import sys; assert sys.version_info >= (3, 8)")
}

func peerScript(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", "mooncake_peer.py"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// pattern is the peer's test pattern: byte i of a region with seed s is
// s + 7i + 13(i>>8) + 29(i>>16) mod 256, for i from start.
func pattern(seed, start, n int) []byte {
	b := make([]byte, n)
	for j := range b {
		i := uint64(start + j)
		b[j] = byte(uint64(seed) + 7*i + 13*(i>>8) + 29*(i>>16))
	}
	return b
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// firstDiff describes where got and want differ, for failure messages.
func firstDiff(got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Sprintf("byte %d: %#x, want %#x", i, got[i], want[i])
		}
	}
	return "equal"
}

// pyPeer is a running mooncake_peer.py in server mode.
type pyPeer struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{} // stdout closed
	errb  bytes.Buffer
}

func startPeer(t *testing.T, args ...string) *pyPeer {
	t.Helper()
	py := python3(t)
	p := &pyPeer{t: t, lines: make(chan string, 4096), done: make(chan struct{})}
	p.cmd = exec.Command(py, append([]string{peerScript(t), "server"}, args...)...)
	p.cmd.Stderr = &p.errb
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody reads; drop
			}
		}
	}()
	t.Cleanup(p.stop)
	return p
}

// stop closes stdin (the peer exits), killing it if it does not.
func (p *pyPeer) stop() {
	p.stdin.Close()
	exited := make(chan error, 1)
	go func() { <-p.done; exited <- p.cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(interopWait):
		p.cmd.Process.Kill()
		<-exited
	}
	if p.t.Failed() && p.errb.Len() > 0 {
		p.t.Logf("peer stderr:\n%s", p.errb.String())
	}
}

// kill ends the peer at once, as a crash would, and waits until it is
// gone (its stdout closes when it exits).
func (p *pyPeer) kill() {
	p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(interopWait):
		p.t.Fatal("killed peer still running")
	}
}

// expect returns the rest of the next line starting with prefix, logging
// the lines it skips.
func (p *pyPeer) expect(prefix string) string {
	p.t.Helper()
	deadline := time.After(interopWait)
	for {
		select {
		case l := <-p.lines:
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return rest
			}
			p.t.Logf("peer: %s", l)
		case <-p.done:
			// Drain what was read before the close.
			for {
				select {
				case l := <-p.lines:
					if rest, ok := strings.CutPrefix(l, prefix); ok {
						return rest
					}
					p.t.Logf("peer: %s", l)
				default:
					p.t.Fatalf("peer exited before printing %q; stderr:\n%s", prefix, p.errb.String())
				}
			}
		case <-deadline:
			p.t.Fatalf("peer did not print %q", prefix)
		}
	}
}

// command sends a control command and returns the reply's rest.
func (p *pyPeer) command(cmd, replyPrefix string) string {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		p.t.Fatalf("peer command %q: %v", cmd, err)
	}
	return p.expect(replyPrefix)
}

// hashIs checks the SHA-256 of the target's [a, a+n); unless now, it
// polls until the target has applied the bytes (v1 WRITEs are not
// acknowledged, so there is no signal to wait for).
func (p *pyPeer) hashIs(a uint64, n int, want string, now bool) {
	p.t.Helper()
	deadline := time.Now().Add(interopWait)
	for {
		got := p.command(fmt.Sprintf("HASH %d %d", a, n), "HASH ")
		if got == want {
			return
		}
		if now || time.Now().After(deadline) {
			p.t.Fatalf("target holds %s at [%#x,+%d), want %s", got, a, n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type peerStats struct {
	V1Read, V1Write, V2Read, V2Write, Rejected, BadOpcode, Connections int
}

func (p *pyPeer) stats() peerStats {
	p.t.Helper()
	var raw map[string]int
	if err := json.Unmarshal([]byte(p.command("STATS", "STATS ")), &raw); err != nil {
		p.t.Fatal(err)
	}
	return peerStats{V1Read: raw["v1_read"], V1Write: raw["v1_write"], V2Read: raw["v2_read"], V2Write: raw["v2_write"],
		Rejected: raw["rejected"], BadOpcode: raw["bad_opcode"], Connections: raw["connections"]}
}

// newEngine starts a TCP-only engine on loopback with memory from a
// mempool registered in the given sizes. It serves Mooncake peers: the
// compatibility switch, no token.
func newEngine(t *testing.T, sizes ...int) (*engine.Engine, [][]byte) {
	t.Helper()
	return newEngineCfg(t, engine.Config{MooncakeCompat: true}, sizes...)
}

func newEngineCfg(t *testing.T, cfg engine.Config, sizes ...int) (*engine.Engine, [][]byte) {
	t.Helper()
	total := 0
	for _, n := range sizes {
		total += n
	}
	pool, err := mempool.New(mempool.Options{Size: int64(total) + 16<<20})
	if err != nil {
		t.Fatal(err)
	}
	cfg.LocalServerName, cfg.Protocols = "127.0.0.1", []string{"tcp"}
	e, err := engine.New(cfg)
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	var bufs [][]byte
	for _, n := range sizes {
		b, err := pool.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.RegisterMemory(b, "cpu:0"); err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("engine Close: %v", err)
		}
		pool.Close()
	})
	return e, bufs
}

// noLeaks checks, after the test's cleanups ran, that it left no
// goroutines and no file descriptors behind. (goleak runs per test here
// rather than in a TestMain, which other files of the package may own.)
func noLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	// The runtime's netpoller (an epoll fd and an eventfd) opens on first
	// network use and lives as long as the process: open it first.
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
	}
	before := openFDs(t)
	t.Cleanup(func() {
		goleak.VerifyNone(t, opt)
		deadline := time.Now().Add(10 * time.Second)
		for {
			now := openFDs(t)
			var extra []string
			for fd, target := range now {
				if before[fd] != target {
					extra = append(extra, fd+" -> "+target)
				}
			}
			if len(extra) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("fds left open: %v", extra)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// openFDs maps this process's open fds to what they point at.
func openFDs(t *testing.T) map[string]string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("cannot list fds: %v", err)
	}
	m := make(map[string]string, len(ents))
	for _, e := range ents {
		target, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		m[e.Name()] = target
	}
	return m
}

func addr(b []byte) uint64 { return transport.AddrOf(b) }

// TestInteropMooncakeClient: a Mooncake-style initiator opens a Crescent
// segment, decodes its descriptor with the reference's rules, moves data
// over the data port (one connection per transfer, many per connection,
// parallel connections, v1 and v2), is refused out-of-bounds requests,
// and sends a notify and a probe.
func TestInteropMooncakeClient(t *testing.T) {
	noLeaks(t)
	py := python3(t)
	e, bufs := newEngine(t, 8<<20, 1<<20)
	mem := bufs[0]
	const (
		writeOff, writeLen, writeSeed = 0, 1<<20 + 3, 11
		readOff, readLen, readSeed    = 2 << 20, 256<<10 + 1, 42
		scratchOff                    = 4 << 20
	)
	copy(mem[readOff:], pattern(readSeed, 0, readLen))
	msg := "batch 7 of request r-123 stored"

	ctx, cancel := context.WithTimeout(context.Background(), 2*interopWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, peerScript(t), "client",
		"--segment", e.Name(),
		"--expect-buffers", fmt.Sprintf("%#x:%#x,%#x:%#x", addr(bufs[0]), len(bufs[0]), addr(bufs[1]), len(bufs[1])),
		"--use-buffer", fmt.Sprintf("%#x", addr(mem)),
		"--write-off", strconv.Itoa(writeOff), "--write-len", strconv.Itoa(writeLen), "--write-seed", strconv.Itoa(writeSeed),
		"--read-off", strconv.Itoa(readOff), "--read-len", strconv.Itoa(readLen), "--read-seed", strconv.Itoa(readSeed),
		"--scratch-off", strconv.Itoa(scratchOff),
		"--notify", msg)
	out, err := cmd.CombinedOutput()
	t.Logf("mooncake_peer.py client:\n%s", out)
	if err != nil || !bytes.Contains(out, []byte("ALL OK")) {
		t.Fatalf("peer checks failed: %v", err)
	}

	// What the peer wrote is in the engine's memory.
	if want := pattern(writeSeed, 0, writeLen); !bytes.Equal(mem[writeOff:writeOff+writeLen], want) {
		t.Fatalf("bytes written by the peer: %s", firstDiff(mem[writeOff:writeOff+writeLen], want))
	}
	// Its v1 write (scratch + 1.5 MiB, 70000 bytes, seed 77) too.
	if got, want := mem[scratchOff+1536<<10:][:70000], pattern(77, 0, 70000); !bytes.Equal(got, want) {
		t.Fatalf("v1 write: %s", firstDiff(got, want))
	}
	var got []engine.Notification
	for _, n := range e.Notifications() {
		if n.Msg == msg {
			got = append(got, n)
		}
	}
	if len(got) != 1 || !strings.HasPrefix(got[0].From, "127.0.0.1:") {
		t.Fatalf("notifications %+v, want one %q from the peer", got, msg)
	}
	if n := e.Notifications(); len(n) != 0 {
		t.Fatalf("Notifications did not drain: %+v", n)
	}
}

// TestInteropMooncakeClientRefusedWithToken: the same Mooncake initiator
// against an engine with a token gets nothing: no descriptor, no bytes.
func TestInteropMooncakeClientRefusedWithToken(t *testing.T) {
	noLeaks(t)
	py := python3(t)
	cfg := engine.Config{Token: testToken}
	cfg.Handshake.Timeout = time.Second
	e, bufs := newEngineCfg(t, cfg, 8<<20, 1<<20)
	mem := bufs[0]
	copy(mem, pattern(42, 0, len(mem)))
	before := bytes.Clone(mem)
	ctx, cancel := context.WithTimeout(context.Background(), 2*interopWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, peerScript(t), "client",
		"--segment", e.Name(),
		"--expect-buffers", fmt.Sprintf("%#x:%#x,%#x:%#x", addr(bufs[0]), len(bufs[0]), addr(bufs[1]), len(bufs[1])),
		"--use-buffer", fmt.Sprintf("%#x", addr(mem)),
		"--write-off", "0", "--write-len", strconv.Itoa(1<<20), "--write-seed", "11",
		"--read-off", strconv.Itoa(2<<20), "--read-len", "4096", "--read-seed", "42",
		"--scratch-off", strconv.Itoa(4<<20), "--notify", "x")
	out, err := cmd.CombinedOutput()
	t.Logf("mooncake_peer.py client:\n%s", out)
	if err == nil || bytes.Contains(out, []byte("ALL OK")) {
		t.Fatalf("a Mooncake peer was served by an engine with a token")
	}
	if !bytes.Equal(mem, before) {
		t.Fatalf("a Mooncake peer changed an engine with a token: %s", firstDiff(mem, before))
	}
}

// waitBatch waits for a batch and fails the test unless it completed.
func waitBatch(t *testing.T, e *engine.Engine, id engine.BatchID) engine.BatchStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), interopWait)
	defer cancel()
	bs, err := e.Wait(ctx, id)
	if err != nil || bs.Status != engine.Completed {
		t.Fatalf("batch %v: %v (%+v)", bs.Status, err, bs)
	}
	return bs
}

func run(t *testing.T, e *engine.Engine, reqs []engine.Request) {
	t.Helper()
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	bs := waitBatch(t, e, b)
	var total uint64
	for _, r := range reqs {
		total += uint64(len(r.Local))
	}
	if bs.Transferred != total || bs.Completed != len(reqs) {
		t.Fatalf("transferred %d in %d requests, want %d in %d", bs.Transferred, bs.Completed, total, len(reqs))
	}
	if err := e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
}

// TestInteropMooncakeTarget: a Crescent engine opens a Mooncake-style
// target, reads its memory, writes and reads back, is refused at Submit
// for ranges outside the descriptor, sees the target's rejected status
// as FAILED, and notifies it.
func TestInteropMooncakeTarget(t *testing.T) {
	for _, version := range []int{2, 1} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			noLeaks(t)
			const (
				base    = 0x7f0000000000
				size    = 4 << 20
				gap     = 1 << 20
				shrink  = 4096 // the target serves each buffer this much shorter than it advertises
				buf1    = base + size + gap
				bigLen  = 2<<20 + 5 // more than one 1 MiB slice
				bigAddr = base + 512<<10
			)
			peer := startPeer(t, "--proto-version", strconv.Itoa(version), "--buffers", "2",
				"--buffer-size", strconv.Itoa(size), "--base", strconv.Itoa(base), "--gap", strconv.Itoa(gap),
				"--shrink", strconv.Itoa(shrink))
			name := peer.expect("SEGMENT ")
			e, bufs := newEngine(t, 16<<20)
			local := bufs[0]

			ctx, cancel := context.WithTimeout(context.Background(), interopWait)
			defer cancel()
			seg, err := e.OpenSegment(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if r := peer.expect("PEERDESC "); !strings.HasPrefix(r, "ok "+e.Name()) {
				t.Fatalf("the peer could not decode Crescent's descriptor: %s", r)
			}
			d, err := e.SegmentDesc(seg)
			if err != nil {
				t.Fatal(err)
			}
			if d.Name != name || d.Protocol != "tcp" || d.TCPProtoVersion != version || d.TCPDataPort == 0 || d.TCPDataHost != "" ||
				len(d.Buffers) != 2 || d.Buffers[0].Addr != base || d.Buffers[0].Length != size || d.Buffers[1].Addr != buf1 ||
				d.Buffers[0].Name != name {
				t.Fatalf("descriptor %+v", d)
			}

			// 1. Read what the target holds: buffer i is pattern(seed i+1).
			r0, r1 := local[0:1<<20], local[1<<20:][:300000]
			run(t, e, []engine.Request{
				{Op: engine.Read, Local: r0, Target: seg, TargetAddr: base},
				{Op: engine.Read, Local: r1, Target: seg, TargetAddr: buf1 + 100000},
			})
			if want := pattern(1, 0, len(r0)); !bytes.Equal(r0, want) {
				t.Fatalf("read of buffer 0: %s", firstDiff(r0, want))
			}
			if want := pattern(2, 100000, len(r1)); !bytes.Equal(r1, want) {
				t.Fatalf("read of buffer 1: %s", firstDiff(r1, want))
			}

			// 2. Write a large region and 16 small ones in one batch.
			big := local[4<<20:][:bigLen]
			copy(big, pattern(60, 0, bigLen))
			reqs := []engine.Request{{Op: engine.Write, Local: big, Target: seg, TargetAddr: bigAddr}}
			smalls := local[8<<20:]
			for k := range 16 {
				n := 4096 + k*37
				s := smalls[k*8192:][:n]
				copy(s, pattern(70+k, 0, n))
				reqs = append(reqs, engine.Request{Op: engine.Write, Local: s, Target: seg, TargetAddr: buf1 + uint64(k)*8192})
			}
			run(t, e, reqs)
			// The bytes are at the right addresses in the target. A v2
			// WRITE completes once the target acknowledged it; a v1 WRITE
			// once the local kernel took the bytes (as in the reference),
			// so the target may still be applying it.
			for k := -1; k < 16; k++ {
				a, want := uint64(bigAddr), sha(big)
				n := bigLen
				if k >= 0 {
					n = 4096 + k*37
					a, want = buf1+uint64(k)*8192, sha(pattern(70+k, 0, n))
				}
				peer.hashIs(a, n, want, version >= 2)
			}

			// 3. Read it back.
			back := local[12<<20:][:bigLen]
			run(t, e, []engine.Request{{Op: engine.Read, Local: back, Target: seg, TargetAddr: bigAddr}})
			if !bytes.Equal(back, big) {
				t.Fatalf("read back: %s", firstDiff(back, big))
			}

			// 4. Ranges outside the descriptor are refused at Submit, and a
			// refused Submit starts nothing.
			b, err := e.AllocateBatch(4)
			if err != nil {
				t.Fatal(err)
			}
			for _, bad := range []struct {
				name string
				addr uint64
			}{
				{"straddles the end of buffer 0", base + size - 8},
				{"in the gap", base + size + 10},
				{"below the first buffer", base - 4096},
				{"past the last buffer", buf1 + size},
			} {
				err := e.Submit(b, []engine.Request{
					{Op: engine.Read, Local: local[:16], Target: seg, TargetAddr: base},
					{Op: engine.Read, Local: local[16:32], Target: seg, TargetAddr: bad.addr},
				})
				var re *engine.RequestError
				if !errors.Is(err, engine.ErrOutOfBounds) || !errors.As(err, &re) || re.Index != 1 {
					t.Fatalf("%s: Submit = %v, want ErrOutOfBounds for request 1", bad.name, err)
				}
			}
			if bs, err := e.BatchStatus(b); err != nil || bs.Requests != 0 || bs.Status != engine.Waiting {
				t.Fatalf("after refused Submits: %+v, %v", bs, err)
			}

			// 5. A range the descriptor lists but the target refuses: the
			// request ends FAILED (v2: the target's rejected status word).
			before := peer.stats()
			if err := e.Submit(b, []engine.Request{{Op: engine.Read, Local: local[:4096], Target: seg, TargetAddr: buf1 + size - shrink}}); err != nil {
				t.Fatal(err)
			}
			wctx, wcancel := context.WithTimeout(context.Background(), interopWait)
			bs, err := e.Wait(wctx, b)
			wcancel()
			if err == nil || bs.Status != engine.Failed {
				t.Fatalf("refused READ: %v, %+v", err, bs)
			}
			if version >= 2 && !errors.Is(bs.Err, transport.ErrRejected) {
				t.Fatalf("refused v2 READ: %v, want transport.ErrRejected", bs.Err)
			}
			if after := peer.stats(); after.Rejected <= before.Rejected {
				t.Fatalf("the target did not see the refused request: %+v", after)
			}
			if err := e.FreeBatch(b); err != nil {
				t.Fatal(err)
			}
			// And the engine keeps working with the target.
			run(t, e, []engine.Request{{Op: engine.Read, Local: local[:4096], Target: seg, TargetAddr: buf1 + size - shrink - 4096}})

			// 6. A notification attached to a batch reaches the target.
			msg := fmt.Sprintf("kv blocks stored (v%d)", version)
			b, err = e.AllocateBatch(1)
			if err != nil {
				t.Fatal(err)
			}
			copy(local[:64], pattern(90, 0, 64))
			if err := e.SubmitWithNotify(b, []engine.Request{{Op: engine.Write, Local: local[:64], Target: seg, TargetAddr: base + 100}}, seg, msg); err != nil {
				t.Fatal(err)
			}
			if bs := waitBatch(t, e, b); bs.NotifyErr != nil {
				t.Fatalf("notify: %v", bs.NotifyErr)
			}
			var n struct {
				Name      string `json:"name"`
				NotifyMsg string `json:"notify_msg"`
			}
			if err := json.Unmarshal([]byte(peer.expect("NOTIFY ")), &n); err != nil {
				t.Fatal(err)
			}
			if n.Name != e.Name() || n.NotifyMsg != msg {
				t.Fatalf("target got notify %+v, want {%s %s}", n, e.Name(), msg)
			}
			if err := e.FreeBatch(b); err != nil {
				t.Fatal(err)
			}

			// 7. The engine spoke the version the descriptor asked for.
			st := peer.stats()
			if st.BadOpcode != 0 {
				t.Fatalf("v2 requests sent to a v1 target: %+v", st)
			}
			if version >= 2 && (st.V1Read+st.V1Write != 0 || st.V2Read == 0 || st.V2Write == 0) {
				t.Fatalf("v2 target saw %+v", st)
			}
			if version < 2 && (st.V2Read+st.V2Write != 0 || st.V1Read == 0 || st.V1Write == 0) {
				t.Fatalf("v1 target saw %+v", st)
			}
			if err := e.CloseSegment(seg); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestInteropTargetKilled: when the target process dies, requests to it
// end FAILED (or TIMEOUT) by their deadline; nothing hangs.
func TestInteropTargetKilled(t *testing.T) {
	noLeaks(t)
	peer := startPeer(t, "--buffers", "1", "--buffer-size", strconv.Itoa(4<<20))
	name := peer.expect("SEGMENT ")
	e, bufs := newEngine(t, 8<<20)
	ctx, cancel := context.WithTimeout(context.Background(), interopWait)
	defer cancel()
	seg, err := e.OpenSegment(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := e.SegmentDesc(seg)
	base := d.Buffers[0].Addr
	run(t, e, []engine.Request{{Op: engine.Read, Local: bufs[0][:1<<20], Target: seg, TargetAddr: base}})
	peer.kill()
	b, err := e.AllocateBatch(8)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []engine.Request
	for k := range 8 {
		reqs = append(reqs, engine.Request{Op: engine.Read, Local: bufs[0][k<<20:][:1<<20], Target: seg, TargetAddr: base})
	}
	if err := e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	bs, err := e.Wait(ctx, b)
	if err == nil || bs.Failed+bs.TimedOut != len(reqs) {
		t.Fatalf("batch to a dead target: %+v, %v", bs, err)
	}
	if err := e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
}
