package bench

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"time"
	"unsafe"

	"github.com/crescent-kv/crescent/engine"
)

// BaselineEngine is the store benchmark's engine baseline: the same
// clients, workers, value size and batch moving the same bytes with the
// transfer engine alone, between the clients' registered value buffers,
// with no master. A put's baseline is an engine write into the next
// client's buffer, a get's a read from it (the store places a client's
// values on the next client), one engine batch per call as the store
// makes one per call.
const BaselineEngine = "engine"

// bufAddr is the address peers use for this client's value buffers.
func (lc *localClient) bufAddr() uint64 {
	if lc.pool == nil || len(lc.bufs) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(lc.bufs))))
}

// prepareEngine builds the engine baseline's workers: worker w of this
// client moves its own slice of buffer to or from worker w's slice of the
// next client's buffer.
func (lc *localClient) prepareEngine(ctx context.Context, p *storePlan) error {
	cfg := lc.cfg
	if lc.pool == nil {
		return fmt.Errorf("bench: client %d: the engine baseline needs registered buffers (--zero_copy)", lc.index)
	}
	n := len(p.Peers)
	if len(p.PeerBufs) != n {
		return fmt.Errorf("bench: client %d: plan has %d peer buffers for %d peers", lc.index, len(p.PeerBufs), n)
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
		ew := &engineWorker{cfg: cfg, e: e, rng: mrand.New(mrand.NewPCG(uint64(lc.index), uint64(w)+1<<32))}
		for i := range cfg.Batch {
			off := w*span + i*cfg.ValueSize
			ew.reqs = append(ew.reqs, engine.Request{
				Local: lc.bufs[off : off+cfg.ValueSize], Target: seg, TargetAddr: p.PeerBufs[peer] + uint64(off),
			})
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
}

func (w *engineWorker) step(ctx context.Context, h *Histogram) (stepResult, error) {
	get := w.cfg.Operation == "get" || (w.cfg.Operation == "mixed" && w.rng.Float64() < w.cfg.GetRatio)
	op := engine.Write
	if get {
		op = engine.Read
	}
	for i := range w.reqs {
		w.reqs[i].Op = op
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
