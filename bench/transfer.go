package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/internal/netx"
)

// TransferConfig mirrors the reference's transfer_engine_bench flags.
type TransferConfig struct {
	Mode            string // loopback (default) | initiator | target
	Operation       string // read | write
	Protocol        string // shm | tcp | cxl | rdma | efa
	SegmentID       string // target segment (initiator mode)
	LocalServerName string
	MetadataServer  string
	BufferSize      int64
	BatchSize       int
	BlockSize       int
	Duration        time.Duration
	Threads         int
	// Lanes is the number of TCP connections per peer (0 = the
	// transport's default); the TCP baseline opens as many streams.
	Lanes int
	// Warmup runs before measuring (default 1s).
	Warmup time.Duration
	// BaselineServer is a target's raw-stream endpoint (initiator mode,
	// tcp); empty measures the baseline on loopback.
	BaselineServer string
	// Progress, when set, receives a progress line each second.
	Progress io.Writer
	// CXLDevice is the device (or file) both sides map for protocol cxl;
	// empty creates a file in /dev/shm sized for both sides. Side i uses
	// the i-th BufferSize of it (the target is side 1 in loopback mode,
	// side 0 in target mode; the initiator side 0 in loopback mode and 1
	// against a remote target).
	CXLDevice string
	cxlSlot   int
	// RDMADevice selects the rdma transport's NICs: "soft" runs software
	// NICs in this process (loopback mode only), anything else is a
	// comma-separated list of device names (empty: every NIC found).
	RDMADevice string
	// RDMANICs is the number of software NICs per side (default 2).
	RDMANICs int
	rdma     *rdmaSetup
	// FabricProvider is the libfabric provider of protocol efa ("efa",
	// "tcp;ofi_rxm", "sockets"); empty takes $FI_PROVIDER, else "efa".
	FabricProvider string
	// Token, Insecure and MooncakeCompat are the engines' credential
	// settings (engine.Config); both sides of a loopback run share them.
	Token          []byte
	Insecure       bool
	MooncakeCompat bool
}

func (c *TransferConfig) setDefaults() error {
	if c.Mode == "" {
		c.Mode = "loopback"
	}
	if c.Operation == "" {
		c.Operation = "write"
	}
	if c.Protocol == "" {
		c.Protocol = "tcp"
	}
	if c.LocalServerName == "" {
		c.LocalServerName = "127.0.0.1"
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 128
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 64 << 10
	}
	if c.Threads <= 0 {
		c.Threads = 1
	}
	if c.Duration <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.Warmup == 0 {
		c.Warmup = time.Second
	}
	if need := int64(c.BlockSize) * int64(c.BatchSize) * int64(c.Threads); c.BufferSize < need {
		c.BufferSize = need
	}
	switch c.Operation {
	case "read", "write":
	default:
		return fmt.Errorf("bench: --operation must be read or write, not %q", c.Operation)
	}
	switch c.Mode {
	case "loopback", "initiator", "target":
	default:
		return fmt.Errorf("bench: --mode must be loopback, initiator or target, not %q", c.Mode)
	}
	if c.Mode == "initiator" && c.SegmentID == "" {
		return errors.New("bench: initiator mode needs --segment_id")
	}
	return c.checkRDMA()
}

// TransferResult is one run's outcome. Throughputs are in GB/s (1e9).
type TransferResult struct {
	Protocol       string  `json:"protocol"`
	Operation      string  `json:"operation"`
	BlockSize      int     `json:"block_size"`
	BatchSize      int     `json:"batch_size"`
	Threads        int     `json:"threads"`
	DurationS      float64 `json:"duration_s"`
	Batches        int64   `json:"batch_count"`
	Bytes          int64   `json:"bytes"`
	ThroughputGBps float64 `json:"throughput_gbps"`
	Baseline       string  `json:"baseline"`
	BaselineGBps   float64 `json:"baseline_gbps"`
	Ratio          float64 `json:"ratio"`
	P50us          float64 `json:"p50_us"`
	P99us          float64 `json:"p99_us"`
	P999us         float64 `json:"p999_us"`
	// DeviceCalls counts RDMA device-interface calls per batch (protocol
	// rdma).
	DeviceCalls *DeviceCalls `json:"device_calls,omitempty"`
	// FabricCalls counts crossings into libfabric per batch (protocol
	// efa).
	FabricCalls *FabricCalls `json:"fabric_calls,omitempty"`
}

func (c *TransferConfig) engineConfig() engine.Config {
	ec := engine.Config{LocalServerName: c.LocalServerName, MetadataServer: c.MetadataServer, Protocols: []string{c.Protocol},
		Token: c.Token, Insecure: c.Insecure, MooncakeCompat: c.MooncakeCompat}
	ec.TCP.Lanes = c.Lanes
	ec.CXL.Path = c.CXLDevice
	c.rdmaConfig(&ec)
	c.efaConfig(&ec)
	return ec
}

// cxlFile makes a memory-backed file standing in for a CXL device, large
// enough for two sides.
func (c *TransferConfig) cxlFile() (func(), error) {
	if c.CXLDevice != "" {
		return func() {}, nil
	}
	dir := "/dev/shm"
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, "crescent-bench-cxl-*")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Truncate(2 * c.BufferSize); err != nil {
		os.Remove(f.Name())
		return nil, err
	}
	c.CXLDevice = f.Name()
	return func() { os.Remove(f.Name()) }, nil
}

func (c *TransferConfig) lanes() int {
	if c.Lanes > 0 {
		return c.Lanes
	}
	return 4
}

// side is one engine with one registered, prefaulted buffer.
type side struct {
	e    *engine.Engine
	pool *mempool.Pool
	buf  []byte
}

func newSide(c *TransferConfig) (*side, error) {
	if c.Protocol == "cxl" {
		return newCXLSide(c)
	}
	p, err := mempool.New(mempool.Options{Size: c.BufferSize, Name: "crescent-bench"})
	if err != nil {
		return nil, err
	}
	buf, err := p.Alloc(int(c.BufferSize))
	if err != nil {
		p.Close()
		return nil, err
	}
	touch(buf)
	e, err := engine.New(c.engineConfig())
	if err != nil {
		p.Close()
		return nil, err
	}
	if err := e.RegisterMemory(buf, "cpu:0"); err != nil {
		e.Close()
		p.Close()
		return nil, err
	}
	return &side{e: e, pool: p, buf: buf}, nil
}

// newCXLSide registers this side's slot of the shared device.
func newCXLSide(c *TransferConfig) (*side, error) {
	e, err := engine.New(c.engineConfig())
	if err != nil {
		return nil, err
	}
	dev, ok := e.CXLDevice()
	if !ok {
		e.Close()
		return nil, fmt.Errorf("bench: cxl transport did not start on %s", c.CXLDevice)
	}
	slot := int64(c.cxlSlot)
	c.cxlSlot++
	mem := dev.Bytes()
	if int64(len(mem)) < (slot+1)*c.BufferSize {
		e.Close()
		return nil, fmt.Errorf("bench: cxl device of %d bytes has no room for side %d of %d bytes", len(mem), slot, c.BufferSize)
	}
	buf := mem[slot*c.BufferSize : (slot+1)*c.BufferSize]
	touch(buf)
	if err := e.RegisterMemory(buf, "cpu:0"); err != nil {
		e.Close()
		return nil, err
	}
	return &side{e: e, buf: buf}, nil
}

// touch writes every page so no measurement pays first-touch faults.
func touch(buf []byte) {
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = byte(i >> 12)
	}
}

func (s *side) close() {
	s.e.Close()
	if s.pool != nil {
		s.pool.Close()
	}
}

// RunTransfer runs the benchmark in loopback or initiator mode.
func RunTransfer(ctx context.Context, c TransferConfig) (*TransferResult, error) {
	if err := c.setDefaults(); err != nil {
		return nil, err
	}
	if c.Mode == "target" {
		return nil, errors.New("bench: use ServeTarget for target mode")
	}
	if c.Protocol == "cxl" {
		cleanup, err := c.cxlFile()
		if err != nil {
			return nil, err
		}
		defer cleanup()
		if c.Mode == "initiator" {
			c.cxlSlot = 1 // the remote target holds slot 0
		}
	}
	defer c.closeRDMA() // after the engines
	init, err := newSide(&c)
	if err != nil {
		return nil, err
	}
	defer init.close()
	var target *side
	segName := c.SegmentID
	if c.Mode == "loopback" {
		if target, err = newSide(&c); err != nil {
			return nil, err
		}
		defer target.close()
		segName = target.e.Name()
	}
	seg, err := init.e.OpenSegment(ctx, segName)
	if err != nil {
		return nil, err
	}
	defer init.e.CloseSegment(seg)
	desc, err := init.e.SegmentDesc(seg)
	if err != nil {
		return nil, err
	}
	if len(desc.Buffers) == 0 {
		return nil, fmt.Errorf("bench: segment %s has no buffers", segName)
	}
	remoteBase, remoteLen := desc.Buffers[0].Addr, desc.Buffers[0].Length
	if need := uint64(c.BlockSize) * uint64(c.BatchSize) * uint64(c.Threads); remoteLen < need {
		return nil, fmt.Errorf("bench: target buffer of %d bytes < block*batch*threads = %d", remoteLen, need)
	}

	res := &TransferResult{Protocol: c.Protocol, Operation: c.Operation, BlockSize: c.BlockSize, BatchSize: c.BatchSize, Threads: c.Threads}
	// The baseline runs on the same buffers with the same number of
	// streams, alternating with the transfer in rounds of about a second,
	// so drift on a noisy machine weighs on both sides alike.
	baseline := func(d time.Duration) (float64, error) {
		switch {
		case c.streamBaseline() && c.BaselineServer != "":
			return remoteStream(ctx, c.BaselineServer, init.buf, c.lanes(), d, c.Operation)
		case c.streamBaseline():
			dst := init.buf
			if target != nil {
				dst = target.buf
			}
			return loopbackStream(ctx, init.buf, dst, c.lanes(), c.BlockSize, d)
		case target != nil:
			return memcpyBaseline(&c, init.buf, target.buf, d), nil
		default:
			return memcpyBaseline(&c, init.buf, init.buf[len(init.buf)/2:], d), nil
		}
	}
	res.Baseline = "memcpy"
	if c.streamBaseline() {
		res.Baseline = "tcp-stream"
	}
	op := engine.Write
	if c.Operation == "read" {
		op = engine.Read
	}
	run := func(d time.Duration, hist []*Histogram, progress io.Writer) (int64, time.Duration, error) {
		var batches atomic.Int64
		var stop atomic.Bool
		var firstErr error
		var errOnce sync.Once
		var wg sync.WaitGroup
		start := time.Now()
		for tid := 0; tid < c.Threads; tid++ {
			wg.Add(1)
			go func(tid int) {
				defer wg.Done()
				if err := worker(ctx, init.e, seg, op, &c, tid, init.buf, remoteBase, &stop, &batches, hist[tid]); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
				}
			}(tid)
		}
		tick := time.NewTicker(time.Second)
		deadline := time.NewTimer(d)
	loop:
		for {
			select {
			case <-deadline.C:
				break loop
			case <-ctx.Done():
				break loop
			case <-tick.C:
				if stop.Load() {
					break loop
				}
				if progress != nil {
					el := time.Since(start)
					gb := float64(batches.Load()) * float64(c.BatchSize) * float64(c.BlockSize) / 1e9
					fmt.Fprintf(progress, "\r%s %s %dB: %4.0fs/%.0fs  %.2f GB/s   ", c.Protocol, c.Operation, c.BlockSize, el.Seconds(), d.Seconds(), gb/el.Seconds())
				}
			}
		}
		tick.Stop()
		deadline.Stop()
		stop.Store(true)
		wg.Wait()
		if progress != nil {
			fmt.Fprint(progress, "\r\033[K")
		}
		return batches.Load(), time.Since(start), firstErr
	}
	hists := func() []*Histogram {
		h := make([]*Histogram, c.Threads)
		for i := range h {
			h[i] = &Histogram{}
		}
		return h
	}
	if c.Warmup > 0 {
		if _, _, err := run(c.Warmup, hists(), nil); err != nil {
			return nil, err
		}
	}
	hs := hists()
	rounds := max(1, int((c.Duration+time.Second/2)/time.Second))
	var n int64
	var elapsed time.Duration
	var baseBytes float64 // GB/s x seconds, summed over rounds
	calls0, dev := c.deviceCalls()
	fab0 := c.fabricStats()
	for r := 0; r < rounds; r++ {
		d := c.Duration / time.Duration(rounds)
		gbps, err := baseline(d)
		if err != nil {
			return nil, fmt.Errorf("bench: baseline: %w", err)
		}
		baseBytes += gbps * d.Seconds()
		var progress io.Writer
		if c.Progress != nil {
			progress = &roundWriter{w: c.Progress, round: r + 1, rounds: rounds}
		}
		bn, el, err := run(d, hs, progress)
		if err != nil {
			return nil, err
		}
		n, elapsed = n+bn, elapsed+el
	}
	calls1, _ := c.deviceCalls()
	res.DeviceCalls = perBatch(calls0, calls1, dev, n)
	res.FabricCalls = fabricPerBatch(&c, fab0, c.fabricStats(), n)
	var all Histogram
	for _, h := range hs {
		all.Merge(h)
	}
	res.BaselineGBps = baseBytes / c.Duration.Seconds()
	res.DurationS = elapsed.Seconds()
	res.Batches = n
	res.Bytes = n * int64(c.BatchSize) * int64(c.BlockSize)
	res.ThroughputGBps = float64(res.Bytes) / elapsed.Seconds() / 1e9
	if res.BaselineGBps > 0 {
		res.Ratio = res.ThroughputGBps / res.BaselineGBps
	}
	res.P50us = float64(all.Quantile(0.50)) / 1e3
	res.P99us = float64(all.Quantile(0.99)) / 1e3
	res.P999us = float64(all.Quantile(0.999)) / 1e3
	return res, nil
}

// roundWriter prefixes progress lines with the round number.
type roundWriter struct {
	w             io.Writer
	round, rounds int
}

func (r *roundWriter) Write(p []byte) (int, error) {
	if len(p) > 1 && p[0] == '\r' && p[1] != '\033' {
		fmt.Fprintf(r.w, "\rround %d/%d ", r.round, r.rounds)
		_, err := r.w.Write(p[1:])
		return len(p), err
	}
	return r.w.Write(p)
}

// worker is one --threads thread of the reference bench: allocate a batch,
// submit batch_size blocks, wait, free, repeat.
func worker(ctx context.Context, e *engine.Engine, seg engine.SegmentID, op engine.OpCode, c *TransferConfig, tid int, local []byte, remoteBase uint64, stop *atomic.Bool, batches *atomic.Int64, h *Histogram) error {
	reqs := make([]engine.Request, c.BatchSize)
	for i := range reqs {
		off := c.BlockSize * (i*c.Threads + tid)
		reqs[i] = engine.Request{Op: op, Local: local[off : off+c.BlockSize], Target: seg, TargetAddr: remoteBase + uint64(off)}
	}
	for !stop.Load() {
		b, err := e.AllocateBatch(c.BatchSize)
		if err != nil {
			return err
		}
		if err := e.Submit(b, reqs); err != nil {
			e.FreeBatch(b)
			return err
		}
		if _, err := e.Wait(ctx, b); err != nil {
			return err
		}
		for i := range reqs {
			st, _ := e.Status(b, i)
			h.Record(st.Latency)
		}
		if err := e.FreeBatch(b); err != nil {
			return err
		}
		batches.Add(1)
	}
	return nil
}

// memcpyBaseline copies between the same buffers with the same block
// size, pattern and thread count as the transfer.
func memcpyBaseline(c *TransferConfig, src, dst []byte, d time.Duration) float64 {
	n := c.BlockSize * c.BatchSize * c.Threads
	n = min(n, len(src), len(dst))
	var total atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for tid := 0; tid < c.Threads; tid++ {
		wg.Add(1)
		go func(tid int) {
			defer wg.Done()
			var done int64
			for time.Since(start) < d {
				for i := 0; i < c.BatchSize; i++ {
					off := c.BlockSize * (i*c.Threads + tid)
					if off+c.BlockSize > n {
						break
					}
					if c.Operation == "read" {
						copy(src[off:off+c.BlockSize], dst[off:off+c.BlockSize])
					} else {
						copy(dst[off:off+c.BlockSize], src[off:off+c.BlockSize])
					}
					done += int64(c.BlockSize)
				}
			}
			total.Add(done)
		}(tid)
	}
	wg.Wait()
	return float64(total.Load()) / time.Since(start).Seconds() / 1e9
}

// loopbackStream measures raw TCP on loopback: `streams` connections each
// writing block-sized chunks from src while a reader drains into dst.
func loopbackStream(ctx context.Context, src, dst []byte, streams, block int, d time.Duration) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	var received atomic.Int64
	var next atomic.Int64
	deadline := time.Now().Add(d)
	// Each accepted stream drains into its own part of dst.
	loop := netx.Serve(ln, netx.Config{Name: "bench loopback baseline"}, func(c *netx.Conn) {
		c.Busy()
		i := int(next.Add(1)-1) % streams
		part := dst[(len(dst)/streams)*i : (len(dst)/streams)*(i+1)]
		for off := 0; ; {
			if off+block > len(part) {
				off = 0
			}
			n, err := c.Read(part[off : off+block])
			received.Add(int64(n))
			off += n
			if err != nil {
				return
			}
		}
	})
	defer loop.Close()
	conns := make([]net.Conn, streams)
	for i := range conns {
		if conns[i], err = net.Dial("tcp", ln.Addr().String()); err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			return 0, err
		}
		conns[i].(*net.TCPConn).SetNoDelay(true)
	}
	start := time.Now()
	var swg sync.WaitGroup
	for i, c := range conns {
		swg.Add(1)
		go func() {
			defer swg.Done()
			part := src[(len(src)/streams)*i : (len(src)/streams)*(i+1)]
			for off := 0; time.Now().Before(deadline) && ctx.Err() == nil; off += block {
				if off+block > len(part) {
					off = 0
				}
				if _, err := c.Write(part[off : off+block]); err != nil {
					return
				}
			}
		}()
	}
	swg.Wait()
	elapsed := time.Since(start)
	got := received.Load()
	for _, c := range conns {
		c.Close()
	}
	return float64(got) / elapsed.Seconds() / 1e9, nil
}

// AuthResult compares one transfer with authentication off and on, run
// in alternating rounds (off, on, on, off, ...) so drift on a noisy
// machine weighs on both alike.
type AuthResult struct {
	Off    TransferResult `json:"off"`
	On     TransferResult `json:"on"`
	Rounds int            `json:"rounds"`
	// Ratio is On.ThroughputGBps / Off.ThroughputGBps.
	Ratio float64 `json:"ratio"`
}

// RunTransferAuth runs c in loopback mode rounds times without a token
// and rounds times with c.Token (a random one when nil), each of
// c.Duration, and sums each side.
func RunTransferAuth(ctx context.Context, c TransferConfig, rounds int) (*AuthResult, error) {
	if c.Mode != "" && c.Mode != "loopback" {
		return nil, errors.New("bench: --auth both runs in loopback mode only")
	}
	if rounds <= 0 {
		rounds = 3
	}
	token := c.Token
	if token == nil {
		token = make([]byte, 32)
		rand.Read(token)
	}
	res := &AuthResult{Rounds: rounds}
	// Bytes, time and batches add up; the baseline is the mean of the
	// rounds' and latencies are the last round's.
	var nOn, nOff float64
	sum := func(into *TransferResult, r *TransferResult, n *float64) {
		b, d := into.Bytes+r.Bytes, into.DurationS+r.DurationS
		nb, base := into.Batches+r.Batches, into.BaselineGBps*(*n)+r.BaselineGBps
		*n++
		*into = *r
		into.Bytes, into.DurationS, into.Batches = b, d, nb
		into.ThroughputGBps = float64(b) / d / 1e9
		into.BaselineGBps = base / *n
		if into.BaselineGBps > 0 {
			into.Ratio = into.ThroughputGBps / into.BaselineGBps
		}
	}
	for i := 0; i < 2*rounds; i++ {
		on := i%4 == 1 || i%4 == 2 // off, on, on, off
		rc := c
		rc.Token, rc.Insecure, rc.MooncakeCompat = nil, false, false
		if on {
			rc.Token = token
		}
		r, err := RunTransfer(ctx, rc)
		if err != nil {
			return nil, fmt.Errorf("bench: auth %v round %d: %w", on, i/2+1, err)
		}
		if on {
			sum(&res.On, r, &nOn)
		} else {
			sum(&res.Off, r, &nOff)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if res.Off.ThroughputGBps > 0 {
		res.Ratio = res.On.ThroughputGBps / res.Off.ThroughputGBps
	}
	return res, nil
}
