package cxl

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
)

const childEnv = "CRESCENT_CXL_TEST_CHILD"

func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		child(path)
		return
	}
	goleak.VerifyTestMain(m)
}

// fakeDevice makes a file standing in for a CXL device.
func fakeDevice(t testing.TB, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dax0.0")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return path
}

// peer is a segment as the engine would show it to a transport.
type peer struct {
	name string
	desc *metadata.SegmentDesc
}

func (p *peer) Name() string                { return p.name }
func (p *peer) Desc() *metadata.SegmentDesc { return p.desc }
func (p *peer) Refresh(context.Context) (*metadata.SegmentDesc, error) {
	return p.desc, nil
}

// describe builds the descriptor an engine would publish for t with the
// given registered buffers.
func describe(t *Transport, name string, bufs ...[]byte) *metadata.SegmentDesc {
	d := &metadata.SegmentDesc{Name: name, Protocol: "tcp"}
	for _, b := range bufs {
		d.Buffers = append(d.Buffers, metadata.Buffer{Name: "cpu:0", Addr: transport.AddrOf(b), Length: uint64(len(b))})
	}
	t.Describe(d)
	return d
}

func start(t testing.TB, cfg Config) *Transport {
	t.Helper()
	tr := New(cfg)
	if err := tr.Start(transport.Env{LocalName: "x", Host: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

type result struct {
	n   int
	err error
}

func run(tr *Transport, p transport.Peer, op transport.Op, local []byte, remote uint64) result {
	ch := make(chan result, 1)
	tk := transport.NewTask(op, local, remote, time.Now().Add(time.Second), func(_ *transport.Task, n int, err error) { ch <- result{n, err} })
	tr.Submit(p, []*transport.Task{tk})
	return <-ch
}

func TestOpenAndSize(t *testing.T) {
	path := fakeDevice(t, 1<<20)
	d, err := Open(Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Bytes()) != 1<<20 || d.Name() != "dax0.0" {
		t.Fatalf("size %d name %q", len(d.Bytes()), d.Name())
	}
	if off, ok := d.Offset(d.Bytes()[4096:8192]); !ok || off != 4096 {
		t.Fatalf("offset %d %v", off, ok)
	}
	if _, ok := d.Offset(make([]byte, 10)); ok {
		t.Fatal("heap memory reported inside the device")
	}
	d.Close()

	t.Setenv(EnvDevPath, path)
	t.Setenv(EnvDevSize, "65536")
	d, err = Open(Config{Name: "pool-a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Bytes()) != 65536 || d.Name() != "pool-a" {
		t.Fatalf("env size %d name %q", len(d.Bytes()), d.Name())
	}
	d.Close()

	t.Setenv(EnvDevPath, "")
	if _, err := Open(Config{}); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("no device: %v", err)
	}
	if _, err := Open(Config{Path: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Fatal("missing device opened")
	}
	t.Setenv(EnvDevSize, "lots")
	if _, err := Open(Config{Path: path}); err == nil || !strings.Contains(err.Error(), EnvDevSize) {
		t.Fatalf("bad size: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o600)
	t.Setenv(EnvDevSize, "")
	if _, err := Open(Config{Path: empty}); err == nil {
		t.Fatal("empty device opened")
	}
}

// Two transports map the same device, as two engines (or hosts) would:
// what one writes through its mapping the other reads through its own.
func TestSharedDeviceRoundTrip(t *testing.T) {
	for _, flush := range []bool{false, true} {
		if flush && !flushSupported() {
			continue
		}
		t.Run(fmt.Sprintf("flush=%v", flush), func(t *testing.T) {
			path := fakeDevice(t, 4<<20)
			a := start(t, Config{Path: path, Flush: flush})
			b := start(t, Config{Path: path, Flush: flush})
			// b registers the middle of the device; a is the initiator.
			bbuf := b.Device().Bytes()[1<<20 : 2<<20]
			tb := &peer{name: "b", desc: describe(b, "b", bbuf)}
			if tb.desc.CXLName != "dax0.0" || tb.desc.Buffers[0].Offset == nil || *tb.desc.Buffers[0].Offset != 1<<20 {
				t.Fatalf("descriptor %+v", tb.desc)
			}
			local := make([]byte, 300_000)
			for i := range local {
				local[i] = byte(i * 7)
			}
			addr := transport.AddrOf(bbuf) + 12345
			if !a.Accepts(tb, addr, uint64(len(local))) {
				t.Fatal("range not accepted")
			}
			if r := run(a, tb, transport.Write, local, addr); r.err != nil || r.n != len(local) {
				t.Fatalf("write: %+v", r)
			}
			if !bytes.Equal(bbuf[12345:12345+len(local)], local) {
				t.Fatal("b does not see a's write")
			}
			back := make([]byte, len(local))
			if r := run(a, tb, transport.Read, back, addr); r.err != nil || !bytes.Equal(back, local) {
				t.Fatalf("read back: %+v", r)
			}
		})
	}
}

func TestBounds(t *testing.T) {
	path := fakeDevice(t, 1<<20)
	a := start(t, Config{Path: path})
	b := start(t, Config{Path: path})
	other := start(t, Config{Path: fakeDevice(t, 1<<20), Name: "another"})
	bbuf := b.Device().Bytes()[4096 : 4096+8192]
	heap := make([]byte, 4096)
	tb := &peer{name: "b", desc: describe(b, "b", bbuf, heap)}
	base := transport.AddrOf(bbuf)
	cases := []struct {
		name    string
		tr      *Transport
		addr, n uint64
		ok      bool
	}{
		{"inside", a, base, 8192, true},
		{"last byte", a, base + 8191, 1, true},
		{"past the end", a, base + 8000, 200, false},
		{"before", a, base - 1, 2, false},
		{"heap buffer (not on the device)", a, transport.AddrOf(heap), 10, false},
		{"different device", other, base, 10, false},
	}
	for _, c := range cases {
		if got := c.tr.Accepts(tb, c.addr, c.n); got != c.ok {
			t.Errorf("%s: Accepts = %v", c.name, got)
		}
		if !c.ok {
			r := run(c.tr, tb, transport.Write, make([]byte, c.n), c.addr)
			if !errors.Is(r.err, transport.ErrOutOfBounds) {
				t.Errorf("%s: submit %+v", c.name, r)
			}
		}
	}
	// A descriptor lying about its offset cannot reach past the device.
	off := uint64(1<<20 - 10)
	liar := &peer{name: "liar", desc: &metadata.SegmentDesc{Name: "liar", CXLName: "dax0.0",
		Buffers: []metadata.Buffer{{Name: "x", Addr: 1 << 40, Length: 4096, Offset: &off}}}}
	if a.Accepts(liar, 1<<40, 100) {
		t.Fatal("range past the device accepted")
	}
}

// TestTwoProcesses shares a device file with a child process: each sees
// the other's writes.
func TestTwoProcesses(t *testing.T) {
	path := fakeDevice(t, 2<<20)
	a := start(t, Config{Path: path})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	in, _ := cmd.StdinPipe()
	outPipe, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer in.Close()
	out := bufio.NewReader(outPipe)
	line, _ := out.ReadString('\n')
	// The child registered [1 MiB, 2 MiB) of its mapping at some address.
	var name string
	var addr, length, off uint64
	if _, err := fmt.Sscanf(line, "READY %s %d %d %d", &name, &addr, &length, &off); err != nil {
		t.Fatalf("child said %q", line)
	}
	tb := &peer{name: "child", desc: &metadata.SegmentDesc{Name: "child", CXLName: name,
		Buffers: []metadata.Buffer{{Name: "cpu:0", Addr: addr, Length: length, Offset: &off}}}}
	msg := bytes.Repeat([]byte("crescent-cxl "), 1000)
	if r := run(a, tb, transport.Write, msg, addr+100); r.err != nil {
		t.Fatal(r.err)
	}
	fmt.Fprintf(in, "check 100 %d %d\n", len(msg), crc32.ChecksumIEEE(msg))
	if got, _ := out.ReadString('\n'); strings.TrimSpace(got) != "ok" {
		t.Fatalf("child: %q", got)
	}
	// The child writes; we read through the transport.
	fmt.Fprintf(in, "fill 5000 4096 %d\n", 0x5a)
	if got, _ := out.ReadString('\n'); strings.TrimSpace(got) != "ok" {
		t.Fatalf("child: %q", got)
	}
	back := make([]byte, 4096)
	if r := run(a, tb, transport.Read, back, addr+5000); r.err != nil || !bytes.Equal(back, bytes.Repeat([]byte{0x5a}, 4096)) {
		t.Fatalf("read of the child's write: %+v", r)
	}
}

func child(path string) {
	d, err := Open(Config{Path: path})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	buf := d.Bytes()[1<<20 : 2<<20]
	off, _ := d.Offset(buf)
	fmt.Printf("READY %s %d %d %d\n", d.Name(), transport.AddrOf(buf), len(buf), off)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var o, n int
		var v uint32
		switch {
		case strings.HasPrefix(sc.Text(), "check"):
			fmt.Sscanf(sc.Text(), "check %d %d %d", &o, &n, &v)
			fence()
			if crc32.ChecksumIEEE(buf[o:o+n]) == v {
				fmt.Println("ok")
			} else {
				fmt.Println("mismatch")
			}
		case strings.HasPrefix(sc.Text(), "fill"):
			fmt.Sscanf(sc.Text(), "fill %d %d %d", &o, &n, &v)
			for i := o; i < o+n; i++ {
				buf[i] = byte(v)
			}
			fence()
			fmt.Println("ok")
		}
	}
	d.Close()
	os.Exit(0)
}

func BenchmarkCXLWrite(b *testing.B) { benchCopy(b, transport.Write) }
func BenchmarkCXLRead(b *testing.B)  { benchCopy(b, transport.Read) }

func benchCopy(b *testing.B, op transport.Op) {
	for _, size := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			path := fakeDevice(b, 64<<20)
			a := start(b, Config{Path: path})
			t2 := start(b, Config{Path: path})
			reg := t2.Device().Bytes()
			tb := &peer{name: "b", desc: describe(t2, "b", reg)}
			local := make([]byte, 64<<20)
			for i := range local {
				local[i] = byte(i)
			}
			copy(reg, local) // fault the file's pages in before timing
			ch := make(chan result, 1)
			tk := transport.NewTask(op, nil, 0, time.Now().Add(time.Hour), func(_ *transport.Task, n int, err error) { ch <- result{n, err} })
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				off := (i * size) % (len(local) - size)
				tk.Local, tk.RemoteAddr = local[off:off+size], transport.AddrOf(reg)+uint64(off)
				a.Submit(tb, []*transport.Task{tk})
				if r := <-ch; r.err != nil {
					b.Fatal(r.err)
				}
			}
		})
	}
}

// BenchmarkMemcpy is the baseline: the same copies between plain buffers.
func BenchmarkMemcpy(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			src, dst := make([]byte, 64<<20), make([]byte, 64<<20)
			copy(dst, src)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				off := (i * size) % (len(src) - size)
				copy(dst[off:off+size], src[off:off+size])
			}
		})
	}
}
