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

	"github.com/crescent-kv/crescent/internal/auth"
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
// the end drops every object. With a baseline master (bm, the log off)
// the same number of objects goes to each, in alternating rounds of
// Objects/rounds.
func runMeta(ctx context.Context, c *StoreConfig, addr string, bm *inProcessMaster) (res *StoreResult, err error) {
	ms, err := newMetaSide(ctx, c, addr)
	if err != nil {
		return nil, err
	}
	defer ms.close()
	var bs *metaSide
	if bm != nil {
		if bs, err = newMetaSide(ctx, c, bm.addr); err != nil {
			return nil, err
		}
		defer bs.close()
	}
	rounds := 1
	if bs != nil {
		rounds = max(1, min(c.Objects, int((c.Duration+time.Second/2)/time.Second)))
	}
	var tot, base roundStats
	for r := range rounds {
		upto := int64(c.Objects) * int64(r+1) / int64(rounds)
		if bs != nil {
			b, err := bs.round(ctx, upto)
			if err != nil {
				return nil, err
			}
			base.add(b)
			base.Elapsed += b.Elapsed
		}
		s, err := ms.round(ctx, upto)
		if err != nil {
			return nil, err
		}
		tot.add(s)
		tot.Elapsed += s.Elapsed
		if c.Progress != nil && bs != nil {
			fmt.Fprintf(c.Progress, "round %d/%d: crescent %.0f objects/s, %s %.0f objects/s\n", r+1, rounds,
				float64(s.Ops)/s.Elapsed.Seconds(), c.Baseline, float64(base.Ops)/base.Elapsed.Seconds())
		}
	}
	if got := ms.stored.Load(); got != int64(c.Objects) {
		return nil, fmt.Errorf("bench: stored %d objects of %d", got, c.Objects)
	}
	res = &StoreResult{
		Operation: "meta", ValueSize: c.ValueSize, Clients: c.Clients, Threads: c.Threads, Batch: c.Batch,
		Replicas: 1, MasterProtocol: c.MasterProtocol, Baseline: c.Baseline,
		DurationS: tot.Elapsed.Seconds(), Ops: tot.Ops, Puts: tot.Puts,
		OpsPerSec: float64(tot.Ops) / tot.Elapsed.Seconds(),
	}
	res.P50us, res.P99us, res.P999us = percentiles(&tot.Hist)
	if bs != nil && base.Elapsed > 0 {
		res.BaselineOpsPerSec = float64(base.Ops) / base.Elapsed.Seconds()
		res.BaselineP50us, res.BaselineP99us, res.BaselineP999us = percentiles(&base.Hist)
		if res.BaselineOpsPerSec > 0 {
			res.Ratio = res.OpsPerSec / res.BaselineOpsPerSec
		}
	}
	return res, nil
}

// metaSide is one master's meta workload: connections, a mounted
// segment kept alive by heartbeats, and the workers.
type metaSide struct {
	conns   []store.MasterConn
	mc      storepb.MasterClient
	client  *storepb.UUID
	session []byte // proves client
	segID   *storepb.UUID
	next    atomic.Int64 // the next object handed out
	upto    atomic.Int64 // the round stops before this object
	stored  atomic.Int64
	steps   []stepFunc
	hbStop  context.CancelFunc
	hbWG    sync.WaitGroup
}

func newMetaSide(ctx context.Context, c *StoreConfig, addr string) (_ *metaSide, err error) {
	run := runID()
	sess, hi, lo := auth.NewSession()
	ms := &metaSide{client: &storepb.UUID{High: hi, Low: lo}, session: sess, segID: randomUUID()}
	// Room for every object twice over, at least 1 TiB, so no put is
	// refused or evicted.
	size := max(uint64(1)<<40, 2*uint64(c.Objects)*uint64(reserved(c.ValueSize)))
	seg := &storepb.Segment{Id: ms.segID, Name: "crescent-bench-meta-" + run + ":1", Base: 1 << 48, Size: size, Protocol: "tcp"}
	defer func() {
		if err != nil {
			ms.close()
		}
	}()
	var proto string
	for range c.Clients {
		cc, p, err := dialMaster(ctx, addr, c.MasterProtocol, nil)
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		ms.conns, proto = append(ms.conns, cc), p
	}
	c.MasterProtocol = proto
	ms.mc = storepb.NewMasterClient(ms.conns[0])
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = ms.mc.MountSegment(rctx, &storepb.MountSegmentRequest{ClientId: ms.client, Session: ms.session, Segment: seg})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("bench: mount: %w", rpcerr.FromStatus(err))
	}
	// Heartbeats keep the segment alive past the client TTL.
	hbCtx, hbStop := context.WithCancel(ctx)
	ms.hbStop = hbStop
	ms.hbWG.Add(1)
	go func() {
		defer ms.hbWG.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-t.C:
				pctx, cancel := context.WithTimeout(hbCtx, 5*time.Second)
				ms.mc.Ping(pctx, &storepb.PingRequest{ClientId: ms.client, Session: ms.session})
				cancel()
			}
		}
	}()
	for ci := range c.Clients {
		mc := storepb.NewMasterClient(ms.conns[ci])
		for range c.Threads {
			keys := make([]string, 0, c.Batch)
			sizes := make([]uint64, 0, c.Batch)
			ms.steps = append(ms.steps, func(ctx context.Context, h *Histogram) (stepResult, error) {
				base, n := ms.take(int64(c.Batch))
				if n == 0 {
					return stepResult{}, errMetaDone
				}
				keys, sizes = keys[:0], sizes[:0]
				for i := range n {
					keys = append(keys, metaKey(run, base+i))
					sizes = append(sizes, uint64(c.ValueSize))
				}
				t0 := time.Now()
				r1, err := mc.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: ms.client, Session: ms.session, Keys: keys, Sizes: sizes,
					Config: &storepb.ReplicateConfig{PreferredSegments: []string{seg.Name}}, Packed: true})
				if err != nil {
					return stepResult{}, fmt.Errorf("bench: BatchPutStart: %w", rpcerr.FromStatus(err))
				}
				// Decoded as a client would before writing.
				if p := r1.Packed; p != nil {
					if _, err := p.Unpack(len(keys)); err != nil {
						return stepResult{}, fmt.Errorf("bench: BatchPutStart: %w", err)
					}
				}
				if err := itemErrors("BatchPutStart", keys, r1.PackedResults, true, len(r1.Results), func(i int) (int32, string) {
					return r1.Results[i].ErrorCode, r1.Results[i].Message
				}); err != nil {
					return stepResult{}, err
				}
				r2, err := mc.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: ms.client, Session: ms.session, Keys: keys,
					ReplicaType: storepb.ReplicaType_REPLICA_TYPE_MEMORY, Packed: true})
				if err != nil {
					return stepResult{}, fmt.Errorf("bench: BatchPutEnd: %w", rpcerr.FromStatus(err))
				}
				if err := itemErrors("BatchPutEnd", keys, r2.PackedResults, false, len(r2.Results), func(i int) (int32, string) {
					return r2.Results[i].ErrorCode, r2.Results[i].Message
				}); err != nil {
					return stepResult{}, err
				}
				h.Record(time.Since(t0))
				ms.stored.Add(n)
				return stepResult{keys: int(n)}, nil
			})
		}
	}
	return ms, nil
}

// round stores the objects up to upto; no deadline: the workers stop
// when every object of the round is stored.
func (ms *metaSide) round(ctx context.Context, upto int64) (*roundStats, error) {
	ms.upto.Store(upto)
	s, err := drive(ctx, 1<<62, ms.steps)
	if err != nil && !errors.Is(err, errMetaDone) {
		return nil, err
	}
	return s, nil
}

// take hands out the next objects of the round, at most batch.
func (ms *metaSide) take(batch int64) (base, n int64) {
	for {
		base = ms.next.Load()
		n = min(batch, ms.upto.Load()-base)
		if n <= 0 {
			return base, 0
		}
		if ms.next.CompareAndSwap(base, base+n) {
			return base, n
		}
	}
}

func (ms *metaSide) close() {
	if ms.hbStop != nil {
		// Unmounting drops the objects: the next run starts empty.
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		ms.mc.UnmountSegment(uctx, &storepb.UnmountSegmentRequest{ClientId: ms.client, Session: ms.session, SegmentId: ms.segID})
		cancel()
		ms.hbStop()
		ms.hbWG.Wait()
	}
	for _, cc := range ms.conns {
		cc.Close()
	}
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

func itemErrors(rpc string, keys []string, packed *storepb.PackedResults, values bool, n int, get func(int) (int32, string)) error {
	if packed != nil {
		o, err := packed.Unpack(len(keys), values)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", rpc, err)
		}
		get = func(i int) (int32, string) { return o.Codes[i], o.Message(i) }
		n = len(o.Codes)
	}
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
