package mempool_test

import (
	"fmt"

	"github.com/crescent-kv/crescent/engine/mempool"
)

func Example() {
	p, err := mempool.New(mempool.Options{Size: 64 << 20, SlabSize: 16 << 20})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	buf, err := p.Alloc(1 << 20) // page aligned, outside the Go heap
	if err != nil {
		panic(err)
	}
	copy(buf, "kv block")

	// Which memfd and offset back buf: what a same-host peer needs to map it.
	fd, off, _, ok := mempool.Lookup(buf)
	fmt.Println(ok, fd == p.Fd(), off%4096 == 0)

	if err := p.Free(buf); err != nil {
		panic(err)
	}
	st := p.Stats()
	fmt.Println(st.Capacity>>20, "MiB,", st.Allocs, "allocations")
	// Output:
	// true true true
	// 64 MiB, 0 allocations
}
