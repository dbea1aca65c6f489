package metatest

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/metadata"
)

// Hostile is a descriptor no transport may see and the field
// metadata.Validate names when it refuses it.
type Hostile struct {
	Name  string
	Field string
	Desc  *metadata.SegmentDesc
}

// HostileDescs returns descriptors of segment name that a store or a
// peer may hand over and the engine must refuse: the efa first_device
// that overflowed a transport's bounds check, and others of the kinds
// Validate checks.
func HostileDescs(name string) []Hostile {
	mk := func(mut func(d *metadata.SegmentDesc)) *metadata.SegmentDesc {
		d := Desc(name, 2)
		d.Devices = []metadata.Device{{Name: "soft0", GID: "fe80::1"}, {Name: "efa0", GID: "0a0b"}}
		d.Crescent = &metadata.Extension{Version: 1, HostID: "h", Protocols: []string{"rdma", "efa", "tcp"},
			RDMA: &metadata.RDMAInfo{FirstDevice: 0, Devices: 1},
			EFA:  &metadata.EFAInfo{Provider: "efa", FirstDevice: 1, Devices: 1}}
		mut(d)
		return d
	}
	return []Hostile{
		{"efa first_device MaxInt", "crescent.efa.first_device", mk(func(d *metadata.SegmentDesc) { d.Crescent.EFA.FirstDevice = math.MaxInt })},
		{"rdma first_device negative", "crescent.rdma.first_device", mk(func(d *metadata.SegmentDesc) { d.Crescent.RDMA.FirstDevice = -1 })},
		{"tcp_data_port 70000", "tcp_data_port", mk(func(d *metadata.SegmentDesc) { d.TCPDataPort = 70000 })},
		{"overlapping buffers", "buffers[1]", mk(func(d *metadata.SegmentDesc) { d.Buffers[1].Addr = d.Buffers[0].Addr + 4096 })},
		{"more rkeys than devices", "buffers[0].rkey", mk(func(d *metadata.SegmentDesc) { d.Buffers[0].RKey = []uint64{1, 2, 3} })},
	}
}

// CheckRefused fails t unless err is the validation error naming field.
func CheckRefused(t testing.TB, err error, field string) {
	t.Helper()
	var de *metadata.DescError
	if !errors.As(err, &de) || !errors.Is(err, metadata.ErrBadDescriptor) || !errors.Is(err, engine.ErrSegmentNotFound) {
		t.Fatalf("open of a hostile descriptor: %v; want a metadata.DescError", err)
	}
	if de.Field != field {
		t.Fatalf("refused for field %q (%v), want %q", de.Field, err, field)
	}
}

// RunHostile stores hostile descriptors straight into the store (as a
// buggy or malicious writer would) and checks that opening each fails
// with the validation error naming the field, and that the engine then
// still opens a good segment and moves bytes.
func RunHostile(t *testing.T, cfg Config) {
	c := ctx(t)
	a := newNode(t, cfg, 4<<20)
	b := newNode(t, cfg, 4<<20)
	for i, h := range HostileDescs("") {
		t.Run(h.Name, func(t *testing.T) {
			name := fmt.Sprintf("127.0.0.1:%d", i+1) // no engine has it
			h.Desc.Name = name
			raw, err := h.Desc.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			cfg.Raw.Put(t, metadata.NewKeys("").Segment(name), raw)
			_, err = a.e.OpenSegment(c, name)
			CheckRefused(t, err, h.Field)
		})
	}
	seg, err := a.e.OpenSegment(c, b.e.Name())
	if err != nil {
		t.Fatal(err)
	}
	fillBytes(a.buf[:1<<20])
	run(t, a.e, []engine.Request{{Op: engine.Write, Local: a.buf[:1<<20], Target: seg, TargetAddr: b.addr(4096)}}, 0, "")
	if !bytes.Equal(b.buf[4096:4096+1<<20], a.buf[:1<<20]) {
		t.Fatal("written bytes differ")
	}
}

func fillBytes(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
}
