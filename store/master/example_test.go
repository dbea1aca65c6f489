package master_test

import (
	"errors"
	"fmt"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
)

// A master in-process: a client mounts memory, writes an object in two
// steps, and a reader gets its location under a lease.
func Example() {
	m, err := master.New(master.Config{})
	if err != nil {
		panic(err)
	}
	defer m.Close()
	writer := alloc.UUID{Hi: 1, Lo: 1}
	// 1 GiB of the writer's engine segment "10.0.0.1:12345" at 0x7f0000000000.
	seg := alloc.Segment{ID: alloc.UUID{Hi: 2, Lo: 1}, Name: "10.0.0.1:12345", Base: 0x7f0000000000, Size: 1 << 30, Protocol: "tcp"}
	if err := m.MountSegment(writer, seg); err != nil {
		panic(err)
	}
	reps, err := m.PutStart(writer, "model/layer/block-1", 4096, master.ReplicateConfig{})
	if err != nil {
		panic(err)
	}
	// ... the writer copies 4096 bytes to reps[0].Addr of reps[0].SegmentName ...
	if err := m.PutEnd(writer, "model/layer/block-1", master.Memory, nil); err != nil {
		panic(err)
	}
	got, lease, err := m.GetReplicaList("model/layer/block-1")
	if err != nil {
		panic(err)
	}
	fmt.Println(got[0].SegmentName, got[0].Addr == reps[0].Addr, got[0].Status, lease)
	_, _, err = m.GetReplicaList("missing")
	fmt.Println(errors.Is(err, errcode.ErrObjectNotFound))
	// Output:
	// 10.0.0.1:12345 true COMPLETE 10s
	// true
}
