package efa_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/efa"
)

// TestHostileDeviceRange: a peer descriptor whose efa device range does
// not fit its devices (first_device near MaxInt made first+count wrap
// negative and passed the old bounds check, then the slice panicked)
// is neither accepted nor dialled: requests to it fail cleanly. The
// engine refuses such descriptors before a transport sees them
// (metadata.Validate); this is the transport's own defence.
func TestHostileDeviceRange(t *testing.T) {
	needFabric(t)
	prov := providers()[0]
	needProvider(t, prov)
	a := newNode(t, prov, 1<<20, efa.Config{})
	b := newNode(t, prov, 1<<20, efa.Config{})
	good := b.desc()
	ndev := len(good.Devices)
	cases := []struct {
		name         string
		first, count int
	}{
		{"first MaxInt", math.MaxInt, 1},
		{"first+count wraps", math.MaxInt - 1, 2},
		{"both huge", 1 << 62, 1 << 62},
		{"count MaxInt", 0, math.MaxInt},
		{"first negative", -1, 1},
		{"first MinInt", math.MinInt, 1},
		{"one past the end", ndev, 1},
		{"zero devices", 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := *good
			ext := *good.Crescent
			e := *ext.EFA
			e.FirstDevice, e.Devices = tc.first, tc.count
			ext.EFA, d.Crescent = &e, &ext
			err := d.Validate()
			var de *metadata.DescError
			require.ErrorAs(t, err, &de)
			require.ErrorIs(t, err, metadata.ErrBadDescriptor)
			require.Contains(t, []string{"crescent.efa.first_device", "crescent.efa.devices"}, de.Field)

			p := &testPeer{name: b.name, desc: func() *metadata.SegmentDesc { return &d }}
			require.False(t, a.tr.Accepts(p, b.addr(0), 1))
			results := make(chan result, 1)
			got := submit(t, a, p, []*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(0), time.Now().Add(10*time.Second))}, results, 30*time.Second)
			require.True(t, errors.Is(got[0].err, transport.ErrUnreachable), "task error %v", got[0].err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.ErrorIs(t, a.tr.Warmup(ctx, p), transport.ErrUnreachable)
		})
	}
	// The transport still serves a good descriptor.
	results := make(chan result, 1)
	got := submit(t, a, b.peer(), []*transport.Task{task(results, transport.Write, a.buf[:64], b.addr(0), time.Now().Add(10*time.Second))}, results, 30*time.Second)
	require.NoError(t, got[0].err)
}
