package cxl

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
)

// TestHostileOffset: a peer buffer whose device offset plus the
// request's place in it wraps uint64 must not land inside the device
// (before, offset 2^64-4096 and a request 8192 bytes into the buffer
// wrapped to offset 4096 and copied there).
func TestHostileOffset(t *testing.T) {
	const size = 1 << 20
	tr := start(t, Config{Path: fakeDevice(t, size)})
	name := tr.dev.name
	cases := []struct {
		name   string
		off    uint64
		addr   uint64
		length uint64
	}{
		{"offset wraps into the device", math.MaxUint64 - 4095, 1 << 40, 1 << 20},
		{"offset past the device", size, 1 << 40, 4096},
		{"addr+length wraps", 0, math.MaxUint64 - 10, 100},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			off := tc.off
			d := &metadata.SegmentDesc{Name: "hostile", Protocol: "tcp", CXLName: name,
				Buffers: []metadata.Buffer{{Name: "cpu:0", Addr: tc.addr, Length: tc.length, Offset: &off}}}
			p := &peer{name: "hostile", desc: d}
			for _, at := range []uint64{tc.addr, tc.addr + 8192} {
				require.False(t, tr.Accepts(p, at, 4096), "accepted [%#x,+4096)", at)
				var got error
				local := make([]byte, 4096)
				tr.Submit(p, []*transport.Task{transport.NewTask(transport.Write, local, at, time.Time{}, func(_ *transport.Task, _ int, err error) { got = err })})
				require.ErrorIs(t, got, transport.ErrOutOfBounds)
			}
		})
	}
}
