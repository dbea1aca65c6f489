package store

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/store/storepb"
)

// FuzzReplicaList feeds arbitrary master answers (GetReplicaListResponse
// and PutStartResponse bytes) to the code that turns replica descriptors
// into memory accesses: whatever the master says, the client never
// reads or writes outside its own segment, never panics, and a value is
// only ever written to replicas large enough for it.
func FuzzReplicaList(f *testing.F) {
	mem := make([]byte, 1<<16)
	c := newClient(Config{})
	c.name, c.host = "127.0.0.1:15000", "127.0.0.1"
	c.setSegs([]*segment{{mem: mem, info: SegmentInfo{Name: c.name, Base: spanOf(mem).addr, Size: uint64(len(mem))}}})
	base := c.segList()[0].info.Base

	seed := func(reps ...*storepb.ReplicaDescriptor) []byte {
		b, err := proto.Marshal(&storepb.GetReplicaListResponse{Replicas: reps, LeaseTtlMs: 10000})
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	complete := storepb.ReplicaStatus_REPLICA_STATUS_COMPLETE
	f.Add(seed(memReplica(c.name, base+64, 100, complete)), 100)
	f.Add(seed(memReplica(c.name, base+uint64(len(mem))-10, 100, complete), memReplica("10.0.0.1:1", 4096, 100, complete)), 100)
	f.Add(seed(memReplica(c.name, ^uint64(0)-5, 1<<40, complete)), 7)
	f.Add(seed(memReplica("127.0.0.1:2", 1, 0, storepb.ReplicaStatus_REPLICA_STATUS_PROCESSING)), 1)
	f.Add([]byte{0x0a, 0x02, 0x08, 0x01}, 3)

	f.Fuzz(func(t *testing.T, data []byte, valueLen int) {
		var resp storepb.GetReplicaListResponse
		if proto.Unmarshal(data, &resp) != nil {
			return
		}
		// Read side.
		if size, refs, err := c.chooseReplicas("k", resp.Replicas); err == nil {
			if size == 0 || len(refs) == 0 {
				t.Fatalf("accepted %d replicas of %d bytes", len(refs), size)
			}
			for _, r := range refs {
				if b, ok := c.localSlice(r.seg, r.addr, size); ok {
					checkInside(t, mem, b, size)
				}
			}
		}
		// Write side: the same descriptors as PutStart's answer.
		if valueLen <= 0 || valueLen > 1<<20 {
			return
		}
		xs, err := writeXfers("k", make([]byte, valueLen), resp.Replicas, 0)
		if err != nil {
			return
		}
		for i, x := range xs {
			if resp.Replicas[i].GetMemory().GetSize() < uint64(valueLen) {
				t.Fatalf("value of %d bytes written to a replica of %d", valueLen, resp.Replicas[i].GetMemory().GetSize())
			}
			if b, ok := c.localSlice(x.seg, x.addr, uint64(len(x.buf))); ok {
				checkInside(t, mem, b, uint64(len(x.buf)))
			}
		}
	})
}

func checkInside(t *testing.T, mem, b []byte, n uint64) {
	t.Helper()
	lo, hi := spanOf(mem), spanOf(b)
	if uint64(len(b)) != n || hi.addr < lo.addr || hi.end > lo.end {
		t.Fatalf("local slice [%#x,%#x) outside the segment [%#x,%#x)", hi.addr, hi.end, lo.addr, lo.end)
	}
}
