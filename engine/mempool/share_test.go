package mempool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const childEnv = "CRESCENT_MEMPOOL_CHILD"

func pattern(seed byte, b []byte) {
	for i := range b {
		b[i] = seed ^ byte(i) ^ byte(i>>8)
	}
}

func hasPattern(seed byte, b []byte) error {
	for i := range b {
		if want := seed ^ byte(i) ^ byte(i>>8); b[i] != want {
			return fmt.Errorf("byte %d = %#x, want %#x", i, b[i], want)
		}
	}
	return nil
}

// TestShareWithChildProcess hands the pool's memfd to a child process (the
// test binary re-executed into TestChildHelper), which maps it, checks what
// the parent wrote and writes a reply the parent then reads.
func TestShareWithChildProcess(t *testing.T) {
	p := newPool(t, Options{Size: 4 << 20, SlabSize: 1 << 20})
	b, err := p.Alloc(300 << 10)
	if err != nil {
		t.Fatal(err)
	}
	pattern(0x5a, b[:len(b)/2])
	off, _ := p.Offset(b)

	fd, err := unix.Dup(p.Fd()) // os.File takes ownership of what it wraps
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChildHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(),
		childEnv+"=1",
		"CHILD_SIZE="+strconv.FormatInt(p.Size(), 10),
		"CHILD_OFF="+strconv.FormatInt(off, 10),
		"CHILD_LEN="+strconv.Itoa(len(b)))
	cmd.ExtraFiles = []*os.File{f} // fd 3 in the child
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if err := hasPattern(0xa5, b[len(b)/2:]); err != nil {
		t.Fatalf("reply from child not visible: %v\nchild output:\n%s", err, out)
	}
	if err := hasPattern(0x5a, b[:len(b)/2]); err != nil {
		t.Fatalf("parent's half changed: %v", err)
	}
}

// TestChildHelper is the child side of TestShareWithChildProcess.
func TestChildHelper(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs only as the child of TestShareWithChildProcess")
	}
	size, _ := strconv.ParseInt(os.Getenv("CHILD_SIZE"), 10, 64)
	off, _ := strconv.ParseInt(os.Getenv("CHILD_OFF"), 10, 64)
	n, _ := strconv.Atoi(os.Getenv("CHILD_LEN"))
	defer unix.Close(3)
	m, err := Map(3, size, MapOptions{Prefault: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b := m.Bytes()[off : off+int64(n)]
	if err := hasPattern(0x5a, b[:n/2]); err != nil {
		t.Fatalf("child does not see the parent's data: %v", err)
	}
	pattern(0xa5, b[n/2:])
}

func TestMap(t *testing.T) {
	before := openFds(t)
	p := newPool(t, Options{Size: 2 << 20, SlabSize: 1 << 20})
	b, _ := p.Alloc(8192)
	off, _ := p.Offset(b)
	pattern(1, b)

	m, err := Map(p.Fd(), p.Size(), MapOptions{Prefault: true})
	if err != nil {
		t.Fatal(err)
	}
	mb := m.Bytes()
	if &mb[0] == &p.Bytes()[0] {
		t.Fatal("Map returned the pool's own mapping")
	}
	if err := hasPattern(1, mb[off:off+8192]); err != nil {
		t.Fatalf("second mapping does not see the data (prefault must not change contents): %v", err)
	}
	pattern(2, mb[off:off+8192])
	if err := hasPattern(2, b); err != nil {
		t.Fatalf("pool does not see writes through the mapping: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil || m.Bytes() != nil {
		t.Fatalf("second Close = %v, Bytes = %d bytes", err, len(m.Bytes()))
	}

	ro, err := Map(p.Fd(), 4096, MapOptions{ReadOnly: true, Prefault: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(ro.Bytes()) != 4096 {
		t.Fatalf("read-only mapping of %d bytes", len(ro.Bytes()))
	}
	ro.Close()

	tests := []struct {
		name string
		fd   int
		size int64
		want error
	}{
		{"zero size", p.Fd(), 0, ErrInvalidSize},
		{"negative size", p.Fd(), -1, ErrInvalidSize},
		{"beyond the file", p.Fd(), p.Size() + 1, ErrInvalidSize},
		{"bad fd", -1, 4096, unix.EBADF},
	}
	for _, tt := range tests {
		if _, err := Map(tt.fd, tt.size, MapOptions{}); !errors.Is(err, tt.want) {
			t.Errorf("%s: Map = %v, want %v", tt.name, err, tt.want)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if after := openFds(t); after != before {
		t.Fatalf("open fds %d -> %d", before, after)
	}
}

// TestPrefaultTouchFallback forces the path for kernels without
// MADV_POPULATE_WRITE: pages are touched one by one and contents of a
// shared mapping are left as they were.
func TestPrefaultTouchFallback(t *testing.T) {
	populateUnsupported.Store(true)
	defer populateUnsupported.Store(false)
	p := newPool(t, Options{Size: 1 << 20, SlabSize: 1 << 20})
	if st := p.Stats(); st.Prefault != PrefaultTouch {
		t.Fatalf("prefault mode %v, want touch", st.Prefault)
	}
	pattern(9, p.Bytes())
	m, err := Map(p.Fd(), p.Size(), MapOptions{Prefault: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := hasPattern(9, m.Bytes()); err != nil {
		t.Fatalf("touch prefault changed contents: %v", err)
	}
}
