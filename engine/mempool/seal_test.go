package mempool

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// A process we hand the memfd to must not be able to resize it.
func TestMemfdSealed(t *testing.T) {
	p, err := New(Options{Size: 1 << 20, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	seals, err := unix.FcntlInt(uintptr(p.Fd()), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW; seals&want != want {
		t.Fatalf("seals %#x, want shrink and grow", seals)
	}
	if err := unix.Ftruncate(p.Fd(), 4096); !errors.Is(err, unix.EPERM) {
		t.Fatalf("shrinking the memfd: %v", err)
	}
	if err := unix.Ftruncate(p.Fd(), 4<<20); !errors.Is(err, unix.EPERM) {
		t.Fatalf("growing the memfd: %v", err)
	}
}
