package bench

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"time"
	"unsafe"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
)

// BaselineEngine is the store benchmark's engine baseline: the same
// clients, workers, value size and batch moving the same bytes with the
// transfer engine alone, with no master, one engine batch per call as the
// store makes one per call. A put's baseline is an engine write from the
// worker's value slice (the store's source) into the next client's memory
// (where the store places a client's values), a get's a read from there
// into the slice. The remote side is a registered region of each client
// as large as what the store's run reads and writes (its get keys and put
// rings), which each worker walks a value at a time, so the baseline
// touches as much memory as the store and its bytes come from DRAM as the
// store's do, not from the caches.
const BaselineEngine = "engine"

// engineSlots is how many values the engine baseline's region holds.
func (c *StoreConfig) engineSlots() (int, error) {
	gets, ring, err := c.plan()
	if err != nil {
		return 0, err
	}
	return max(gets+c.Threads*ring, c.Threads*c.Batch), nil
}

// newEngineRegion allocates and registers the region peers' engine
// baseline workers move values to and from.
func (lc *localClient) newEngineRegion() error {
	slots, err := lc.cfg.engineSlots()
	if err != nil {
		return err
	}
	size := int64(slots) * int64(lc.cfg.ValueSize)
	if lc.engPool, err = mempool.New(mempool.Options{Size: size, SlabSize: mempool.MinSlabSize, Name: "crescent-bench-engine"}); err != nil {
		return fmt.Errorf("bench: engine baseline region: %w", err)
	}
	region := lc.engPool.Bytes()[:size:size]
	if err := lc.c.RegisterBuffer(region); err != nil {
		return fmt.Errorf("bench: register engine baseline region: %w", err)
	}
	lc.engRegion = region
	return nil
}

// bufAddr is the address peers use for this client's engine baseline
// region (0 without one).
func (lc *localClient) bufAddr() uint64 {
	if len(lc.engRegion) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(lc.engRegion))))
}

// prepareEngine builds the engine baseline's workers: worker w of this
// client moves its own value slices to or from the next client's region,
// starting at its share of it and moving on a value per item.
func (lc *localClient) prepareEngine(ctx context.Context, p *storePlan) error {
	cfg := lc.cfg
	if lc.pool == nil {
		return fmt.Errorf("bench: client %d: the engine baseline needs registered buffers (--zero_copy)", lc.index)
	}
	n := len(p.Peers)
	if len(p.PeerBufs) != n || p.PeerBufs[(lc.index+1)%n] == 0 {
		return fmt.Errorf("bench: client %d: plan has no engine region for its peer", lc.index)
	}
	slots, err := cfg.engineSlots()
	if err != nil {
		return err
	}
	peer := (lc.index + 1) % n
	e := lc.c.Engine()
	seg, err := e.OpenSegment(ctx, p.Peers[peer])
	if err != nil {
		return fmt.Errorf("bench: client %d: open %s: %w", lc.index, p.Peers[peer], err)
	}
	lc.engSeg, lc.engOpen = seg, true
	span := cfg.Batch * cfg.ValueSize
	lc.engSteps = lc.engSteps[:0]
	for w := 0; w < cfg.Threads; w++ {
		ew := &engineWorker{
			cfg: cfg, e: e, rng: mrand.New(mrand.NewPCG(uint64(lc.index), uint64(w)+1<<32)),
			base: p.PeerBufs[peer], slots: slots, next: w * slots / cfg.Threads,
		}
		for i := range cfg.Batch {
			off := w*span + i*cfg.ValueSize
			ew.reqs = append(ew.reqs, engine.Request{Local: lc.bufs[off : off+cfg.ValueSize], Target: seg})
		}
		lc.engSteps = append(lc.engSteps, ew.step)
	}
	return nil
}

func (lc *localClient) runEngine(ctx context.Context, d time.Duration) (*roundStats, error) {
	if len(lc.engSteps) == 0 {
		return nil, fmt.Errorf("bench: client %d: engine baseline not prepared", lc.index)
	}
	return drive(ctx, d, lc.engSteps)
}

// engineWorker is one worker of the engine baseline.
type engineWorker struct {
	cfg  *StoreConfig
	e    *engine.Engine
	reqs []engine.Request
	rng  *mrand.Rand
	// The peer's region: its address, its values, the next one to use.
	base        uint64
	slots, next int
}

func (w *engineWorker) step(ctx context.Context, h *Histogram) (stepResult, error) {
	get := w.cfg.Operation == "get" || (w.cfg.Operation == "mixed" && w.rng.Float64() < w.cfg.GetRatio)
	op := engine.Write
	if get {
		op = engine.Read
	}
	for i := range w.reqs {
		w.reqs[i].Op = op
		w.reqs[i].TargetAddr = w.base + uint64(w.next)*uint64(w.cfg.ValueSize)
		w.next = (w.next + 1) % w.slots
	}
	t0 := time.Now()
	b, err := w.e.AllocateBatch(len(w.reqs))
	if err != nil {
		return stepResult{}, err
	}
	if err := w.e.Submit(b, w.reqs); err != nil {
		w.e.FreeBatch(b)
		return stepResult{}, fmt.Errorf("bench: engine baseline submit: %w", err)
	}
	st, err := w.e.Wait(ctx, b)
	h.Record(time.Since(t0))
	if err != nil {
		return stepResult{}, fmt.Errorf("bench: engine baseline wait: %w", err)
	}
	if st.Status != engine.Completed {
		w.e.FreeBatch(b)
		return stepResult{}, fmt.Errorf("bench: engine baseline batch ended %v (%d of %d failed)", st.Status, st.Failed, st.Requests)
	}
	if err := w.e.FreeBatch(b); err != nil {
		return stepResult{}, err
	}
	n := len(w.reqs)
	return stepResult{keys: n, bytes: int64(n) * int64(w.cfg.ValueSize), get: get}, nil
}
