package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/crescent-kv/crescent/engine"

	// The metadata backends a C program may name in its connection string.
	_ "github.com/crescent-kv/crescent/engine/metadata/all"
)

// maxItems bounds every array a caller passes (requests, keys, buffers)
// before Go memory is allocated for it.
const maxItems = 1 << 20

// unregisterTimeout bounds how long an unregister waits for transfers.
const unregisterTimeout = 10 * time.Second

type engineObj struct {
	e    *engine.Engine
	mu   sync.Mutex
	regs map[uintptr]int // registered memory: address -> length
}

// splitList turns "a, b" into [a b]; "" into nil.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func engineCreate(metadata, name, protocols string) (uint64, error) {
	e, err := engine.New(engine.Config{
		MetadataServer: metadata, LocalServerName: name,
		Protocols: splitList(protocols), Logger: logger,
	})
	if err != nil {
		return 0, err
	}
	return handles.add(&engineObj{e: e, regs: make(map[uintptr]int)}), nil
}

func getEngine(h uint64) (*engineObj, error) {
	o, ok := lookup[*engineObj](&handles, h)
	if !ok {
		return nil, fmt.Errorf("%w: engine %d", errBadHandle, h)
	}
	return o, nil
}

func engineDestroy(h uint64) error {
	o, ok := take[*engineObj](&handles, h)
	if !ok {
		return fmt.Errorf("%w: engine %d", errBadHandle, h)
	}
	return o.e.Close()
}

// cMem views C memory [p, p+n) as a slice (never Go memory: the caller's).
func cMem(p unsafe.Pointer, n uint64) ([]byte, error) {
	if p == nil {
		return nil, badArg("NULL address")
	}
	if n == 0 {
		return nil, badArg("zero length")
	}
	if n > 1<<47 || uint64(uintptr(p))+n < uint64(uintptr(p)) {
		return nil, badArg(fmt.Sprintf("length %d at %p overflows", n, p))
	}
	return unsafe.Slice((*byte)(p), int(n)), nil
}

func (o *engineObj) register(p unsafe.Pointer, n uint64, location string) error {
	mem, err := cMem(p, n)
	if err != nil {
		return err
	}
	if location == "" {
		location = "*"
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, dup := o.regs[uintptr(p)]; dup {
		return fmt.Errorf("%w: %p", engine.ErrAlreadyRegistered, p)
	}
	if err := o.e.RegisterMemory(mem, location); err != nil {
		return err
	}
	o.regs[uintptr(p)] = int(n)
	return nil
}

func (o *engineObj) unregister(p unsafe.Pointer) error {
	o.mu.Lock()
	n, ok := o.regs[uintptr(p)]
	o.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: nothing registered at %p", engine.ErrNotRegistered, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), unregisterTimeout)
	defer cancel()
	err := o.e.UnregisterMemory(ctx, unsafe.Slice((*byte)(p), n))
	if err == nil {
		o.mu.Lock()
		delete(o.regs, uintptr(p))
		o.mu.Unlock()
	}
	return err
}

// request is a C request converted.
type request struct {
	op     int
	src    unsafe.Pointer
	target uint64
	addr   uint64
	length uint64
}

func toRequests(in []request) ([]engine.Request, error) {
	out := make([]engine.Request, len(in))
	for i, r := range in {
		var op engine.OpCode
		switch r.op {
		case 0:
			op = engine.Read
		case 1:
			op = engine.Write
		default:
			return nil, &engine.RequestError{Index: i, Err: fmt.Errorf("%w: %d", engine.ErrInvalidOp, r.op)}
		}
		mem, err := cMem(r.src, r.length)
		if err != nil {
			return nil, &engine.RequestError{Index: i, Err: err}
		}
		out[i] = engine.Request{Op: op, Local: mem, Target: engine.SegmentID(r.target), TargetAddr: r.addr}
	}
	return out, nil
}

func (o *engineObj) submit(batch uint64, reqs []request, notify bool, target uint64, msg string) error {
	rs, err := toRequests(reqs)
	if err != nil {
		return err
	}
	if notify {
		return o.e.SubmitWithNotify(engine.BatchID(batch), rs, engine.SegmentID(target), msg)
	}
	return o.e.Submit(engine.BatchID(batch), rs)
}

func (o *engineObj) wait(batch uint64, timeoutMs int64) (engine.BatchStatus, error) {
	ctx := context.Background()
	if timeoutMs >= 0 && timeoutMs < 1<<40 { // longer: no limit but the engine's
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(timeoutMs)*time.Millisecond)
		defer cancel()
	}
	st, err := o.e.Wait(ctx, engine.BatchID(batch))
	if errors.Is(err, engine.ErrInvalidBatch) || errors.Is(err, engine.ErrClosed) {
		return st, err // no batch to report on; other errors are in st
	}
	return st, nil
}

// openNoCache opens name with its descriptor fetched now, even when the
// segment is open already (the reference's openSegmentNoCache).
func (o *engineObj) openNoCache(name string) (engine.SegmentID, error) {
	id, err := o.e.OpenSegment(bg(), name)
	if err != nil {
		return 0, err
	}
	if err := o.e.RefreshSegment(bg(), id); err != nil {
		o.e.CloseSegment(id)
		return 0, err
	}
	return id, nil
}

// installTransport starts proto on the live engine (engine.InstallTransport);
// one running already is done.
func (o *engineObj) installTransport(proto string) error {
	if proto == "" {
		return badArg("empty protocol")
	}
	return o.e.InstallTransport(bg(), proto)
}

// uninstallTransport stops proto (engine.UninstallTransport): requests it
// carries fail, later ones it alone could carry are refused.
func (o *engineObj) uninstallTransport(proto string) error {
	if proto == "" {
		return badArg("empty protocol")
	}
	return o.e.UninstallTransport(bg(), proto)
}
