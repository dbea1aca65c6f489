package bench

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// runMeta measures the master's metadata throughput: Clients master
// connections with Threads workers each store Objects objects of
// ValueSize bytes with BatchPutStart + BatchPutEnd of Batch keys, on a
// segment mounted for the run (the master never touches memory, so the
// segment is an address range and nothing is written). Unmounting it at
// the end drops every object.
func runMeta(ctx context.Context, c *StoreConfig, addr string) (*StoreResult, error) {
	run := runID()
	client, segID := randomUUID(), randomUUID()
	// Room for every object twice over, at least 1 TiB, so no put is
	// refused or evicted.
	size := max(uint64(1)<<40, 2*uint64(c.Objects)*uint64(reserved(c.ValueSize)))
	seg := &storepb.Segment{Id: segID, Name: "crescent-bench-meta-" + run + ":1", Base: 1 << 48, Size: size, Protocol: "tcp"}

	var conns []store.MasterConn
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	var proto string
	for range c.Clients {
		cc, p, err := store.DialMaster(ctx, addr, c.MasterProtocol, nil)
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		conns, proto = append(conns, cc), p
	}
	c.MasterProtocol = proto
	mc := storepb.NewMasterClient(conns[0])
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := mc.MountSegment(rctx, &storepb.MountSegmentRequest{ClientId: client, Segment: seg})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("bench: mount: %w", rpcerr.FromStatus(err))
	}
	defer func() {
		// Unmounting drops the objects: the next run starts empty.
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		mc.UnmountSegment(uctx, &storepb.UnmountSegmentRequest{ClientId: client, SegmentId: segID})
	}()
	// Heartbeats keep the segment alive past the client TTL.
	hbCtx, hbStop := context.WithCancel(ctx)
	var hbWG sync.WaitGroup
	hbWG.Add(1)
	go func() {
		defer hbWG.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-t.C:
				pctx, cancel := context.WithTimeout(hbCtx, 5*time.Second)
				mc.Ping(pctx, &storepb.PingRequest{ClientId: client})
				cancel()
			}
		}
	}()
	defer func() { hbStop(); hbWG.Wait() }()

	var next, stored atomic.Int64
	var steps []stepFunc
	for ci := range c.Clients {
		mc := storepb.NewMasterClient(conns[ci])
		for range c.Threads {
			keys := make([]string, 0, c.Batch)
			sizes := make([]uint64, 0, c.Batch)
			steps = append(steps, func(ctx context.Context, h *Histogram) (stepResult, error) {
				base := next.Add(int64(c.Batch)) - int64(c.Batch)
				n := min(int64(c.Batch), int64(c.Objects)-base)
				if n <= 0 {
					return stepResult{}, errMetaDone
				}
				keys, sizes = keys[:0], sizes[:0]
				for i := range n {
					keys = append(keys, metaKey(run, base+i))
					sizes = append(sizes, uint64(c.ValueSize))
				}
				t0 := time.Now()
				r1, err := mc.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: client, Keys: keys, Sizes: sizes,
					Config: &storepb.ReplicateConfig{PreferredSegments: []string{seg.Name}}})
				if err != nil {
					return stepResult{}, fmt.Errorf("bench: BatchPutStart: %w", rpcerr.FromStatus(err))
				}
				if err := itemErrors("BatchPutStart", keys, len(r1.Results), func(i int) (int32, string) {
					return r1.Results[i].ErrorCode, r1.Results[i].Message
				}); err != nil {
					return stepResult{}, err
				}
				r2, err := mc.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: client, Keys: keys, ReplicaType: storepb.ReplicaType_REPLICA_TYPE_MEMORY})
				if err != nil {
					return stepResult{}, fmt.Errorf("bench: BatchPutEnd: %w", rpcerr.FromStatus(err))
				}
				if err := itemErrors("BatchPutEnd", keys, len(r2.Results), func(i int) (int32, string) {
					return r2.Results[i].ErrorCode, r2.Results[i].Message
				}); err != nil {
					return stepResult{}, err
				}
				h.Record(time.Since(t0))
				stored.Add(n)
				return stepResult{keys: int(n)}, nil
			})
		}
	}
	// No deadline: the workers stop when every object is stored.
	s, err := drive(ctx, 1<<62, steps)
	if err != nil && !errors.Is(err, errMetaDone) {
		return nil, err
	}
	if got := stored.Load(); got != int64(c.Objects) {
		return nil, fmt.Errorf("bench: stored %d objects of %d", got, c.Objects)
	}
	res := &StoreResult{
		Operation: "meta", ValueSize: c.ValueSize, Clients: c.Clients, Threads: c.Threads, Batch: c.Batch,
		Replicas: 1, MasterProtocol: c.MasterProtocol, Baseline: "none",
		DurationS: s.Elapsed.Seconds(), Ops: s.Ops, Puts: s.Puts,
		OpsPerSec: float64(s.Ops) / s.Elapsed.Seconds(),
	}
	res.P50us, res.P99us, res.P999us = percentiles(&s.Hist)
	return res, nil
}

// errMetaDone ends a meta worker once every object is handed out.
var errMetaDone = errors.New("bench: all objects stored")

// metaKey is "crescent-bench/<run>/m<i>" (about 32 bytes, like a block
// hash key), built without fmt.
func metaKey(run string, i int64) string {
	var b [64]byte
	out := append(b[:0], "crescent-bench/"...)
	out = append(out, run...)
	out = append(out, "/m"...)
	return string(strconv.AppendInt(out, i, 10))
}

func itemErrors(rpc string, keys []string, n int, get func(int) (int32, string)) error {
	if n != len(keys) {
		return fmt.Errorf("bench: %s answered %d results for %d keys", rpc, n, len(keys))
	}
	for i := range n {
		if code, msg := get(i); code != 0 {
			return fmt.Errorf("bench: %s %s: %w", rpc, keys[i], errcode.FromCode(errcode.Code(code), msg))
		}
	}
	return nil
}

func randomUUID() *storepb.UUID {
	var b [16]byte
	rand.Read(b[:])
	return &storepb.UUID{High: binary.BigEndian.Uint64(b[:8]), Low: binary.BigEndian.Uint64(b[8:]) | 1}
}
