package transport

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRegistryAddFindOverlap(t *testing.T) {
	g := NewRegistry()
	mem := make([]byte, 4096)
	a, b := mem[:1024], mem[2048:3072]
	if _, err := g.Add(a, "cpu:0", -1, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Add(b, "cpu:0", -1, 0, 0); err != nil {
		t.Fatal(err)
	}
	v := g.Version()
	for _, bad := range [][]byte{mem[1000:1100], mem[1500:2100], mem[0:4096], mem[3000:3100], a} {
		if _, err := g.Add(bad, "", -1, 0, 0); !errors.Is(err, ErrAlreadyExists) {
			t.Fatalf("overlap [%d,%d) accepted: %v", AddrOf(bad)-AddrOf(mem), AddrOf(bad)-AddrOf(mem)+uint64(len(bad)), err)
		}
	}
	if _, err := g.Add(mem[:0], "", -1, 0, 0); !errors.Is(err, ErrInvalidAddress) {
		t.Fatalf("empty: %v", err)
	}
	if g.Version() != v {
		t.Fatal("refused adds changed the version")
	}
	base := AddrOf(mem)
	cases := []struct {
		addr, n uint64
		ok      bool
	}{
		{base, 1024, true},
		{base + 1023, 1, true},
		{base + 1023, 2, false}, // runs past a
		{base + 1024, 1, false}, // the gap
		{base + 2048, 1024, true},
		{base + 2047, 2, false},
		{base + 3072, 1, false},
		{base - 1, 1, false},
	}
	for _, c := range cases {
		_, ok := g.Find(c.addr, c.n)
		if ok != c.ok {
			t.Errorf("Find(+%d, %d) = %v", c.addr-base, c.n, ok)
		}
		l, err := g.Acquire(c.addr, c.n)
		if (err == nil) != c.ok {
			t.Errorf("Acquire(+%d, %d) = %v", c.addr-base, c.n, err)
		}
		if err == nil {
			if AddrOf(l.Mem) != c.addr || uint64(len(l.Mem)) != c.n || cap(l.Mem) != len(l.Mem) {
				t.Errorf("lease %d bytes at +%d cap %d", len(l.Mem), AddrOf(l.Mem)-base, cap(l.Mem))
			}
			l.Release()
		} else if !errors.Is(err, ErrOutOfBounds) {
			t.Errorf("error %v is not ErrOutOfBounds", err)
		}
	}
	if _, err := g.Acquire(base, 0); !errors.Is(err, ErrInvalidAddress) {
		t.Fatalf("zero length: %v", err)
	}
	if _, err := g.Acquire(^uint64(0)-1, 4); !errors.Is(err, ErrInvalidAddress) {
		t.Fatalf("wrap: %v", err)
	}
}

func TestRegistryRemoveWaitsForUsers(t *testing.T) {
	g := NewRegistry()
	mem := make([]byte, 1024)
	g.Add(mem, "", -1, 0, 0)
	l, err := g.Acquire(AddrOf(mem)+10, 10)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := g.Remove(context.Background(), AddrOf(mem))
		done <- err
	}()
	// New users are refused at once, while the old one still holds it.
	eventuallyT(t, func() bool {
		l, err := g.Acquire(AddrOf(mem), 1)
		l.Release()
		return errors.Is(err, ErrOutOfBounds)
	})
	select {
	case err := <-done:
		t.Fatalf("Remove returned while a lease was held: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	l.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := g.Remove(context.Background(), AddrOf(mem)); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("second remove: %v", err)
	}
}

func TestRegistryRemoveTimeout(t *testing.T) {
	g := NewRegistry()
	mem := make([]byte, 64)
	g.Add(mem, "", -1, 0, 0)
	l, _ := g.Acquire(AddrOf(mem), 64)
	defer l.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := g.Remove(ctx, AddrOf(mem)); !errors.Is(err, ErrBufferBusy) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("busy remove: %v", err)
	}
}

// TestRegistryRace hammers Acquire against Add/Remove under -race: no
// lease is ever held on a region whose Remove has returned.
func TestRegistryRace(t *testing.T) {
	g := NewRegistry()
	mem := make([]byte, 1<<16)
	var removed sync.Map // *Region -> struct{}, once Remove returned
	var violations atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if l, err := g.Acquire(AddrOf(mem)+100, 100); err == nil {
					if _, gone := removed.Load(l.r); gone {
						violations.Add(1)
					}
					l.Release()
				}
			}
		}()
	}
	for i := 0; i < 2000; i++ {
		r, err := g.Add(mem, "", -1, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.Remove(context.Background(), r.Addr); err != nil {
			t.Fatal(err)
		}
		removed.Store(r, struct{}{})
	}
	close(stop)
	wg.Wait()
	if n := violations.Load(); n > 0 {
		t.Fatalf("%d leases held on removed regions", n)
	}
}

func eventuallyT(t *testing.T, f func() bool) {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for !f() {
		if time.Now().After(end) {
			t.Fatal("condition not met")
		}
		time.Sleep(time.Millisecond)
	}
}
