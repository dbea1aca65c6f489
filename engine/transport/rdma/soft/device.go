package soft

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// Fabric is a simulated subnet: devices created on one fabric reach each
// other's QPs by GID (or LID) and QP number, as NICs on one network do.
type Fabric struct {
	mu    sync.Mutex
	byGID map[rdmadev.GID]*Device
	byLID map[uint16]*Device
	n     int
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric {
	return &Fabric{byGID: make(map[rdmadev.GID]*Device), byLID: make(map[uint16]*Device)}
}

// Options describe a software NIC.
type Options struct {
	// NUMANode is the node the NIC reports (default 0; -1 = unknown).
	NUMANode int
	// MTU is the port's active MTU (default 4096).
	MTU rdmadev.MTU
	// LinkLayer is Ethernet (RoCE, LID 0, the default) or InfiniBand
	// (a LID is assigned).
	LinkLayer rdmadev.LinkLayer
}

// Device is a software RDMA NIC implementing rdmadev.Device. One worker
// goroutine plays the HCA: it executes posted work requests against the
// registered memory of the target device, checking keys, bounds and
// access flags, and writes completions in posting order per QP.
type Device struct {
	f    *Fabric
	name string
	numa int
	ll   rdmadev.LinkLayer
	lid  uint16
	gid  rdmadev.GID
	mtu  rdmadev.MTU

	mu      sync.Mutex
	port    rdmadev.PortState
	pds     map[*pd]struct{}
	cqs     map[*cq]struct{}
	qps     map[uint32]*qp
	lkeys   map[uint32]*mr
	rkeys   map[uint32]*mr
	nextQPN uint32
	nextKey uint32
	faults  []*faultEntry
	ready   []*qp
	closed  bool

	wake chan struct{}
	stop chan struct{}
	done chan struct{}

	st stats
}

var _ rdmadev.Device = (*Device)(nil)

type stats struct {
	post, posted, poll, polled, arm, wait, control atomic.Uint64
	qpsCreated, qpsDestroyed, resets, flushed      atomic.Uint64
	executed, bytes, errors, dropped               atomic.Uint64
}

// Stats counts calls through the device interface (on real hardware,
// each call is one cgo crossing) and what the device did.
type Stats struct {
	PostCalls   uint64 // QP.PostSend calls
	PostedWRs   uint64 // work requests accepted by those calls
	PollCalls   uint64 // CQ.Poll calls
	Completions uint64 // completions returned by those calls
	ArmCalls    uint64 // CQ.Arm calls
	WaitCalls   uint64 // CQ.Wait calls
	// ControlCalls counts every other call (PD/CQ/QP/MR creation and
	// destruction, QP transitions, port queries).
	ControlCalls uint64

	QPsCreated, QPsDestroyed uint64
	Resets                   uint64 // QPs moved to RESET (including by Close)
	Flushed                  uint64 // WRs completed with WCWRFlushErr
	Executed                 uint64 // WRs that moved data
	Bytes                    uint64 // bytes they moved
	Errors                   uint64 // WRs completed with an error other than flush
	Dropped                  uint64 // completions lost by FaultDrop
}

// HotCalls is the number of data-path calls: PostSend, Poll, Arm, Wait.
func (s Stats) HotCalls() uint64 { return s.PostCalls + s.PollCalls + s.ArmCalls + s.WaitCalls }

// Sub returns s - o, field by field.
func (s Stats) Sub(o Stats) Stats {
	return Stats{
		PostCalls: s.PostCalls - o.PostCalls, PostedWRs: s.PostedWRs - o.PostedWRs,
		PollCalls: s.PollCalls - o.PollCalls, Completions: s.Completions - o.Completions,
		ArmCalls: s.ArmCalls - o.ArmCalls, WaitCalls: s.WaitCalls - o.WaitCalls,
		ControlCalls: s.ControlCalls - o.ControlCalls,
		QPsCreated:   s.QPsCreated - o.QPsCreated, QPsDestroyed: s.QPsDestroyed - o.QPsDestroyed,
		Resets: s.Resets - o.Resets, Flushed: s.Flushed - o.Flushed,
		Executed: s.Executed - o.Executed, Bytes: s.Bytes - o.Bytes,
		Errors: s.Errors - o.Errors, Dropped: s.Dropped - o.Dropped,
	}
}

// Add returns s + o, field by field.
func (s Stats) Add(o Stats) Stats {
	return Stats{
		PostCalls: s.PostCalls + o.PostCalls, PostedWRs: s.PostedWRs + o.PostedWRs,
		PollCalls: s.PollCalls + o.PollCalls, Completions: s.Completions + o.Completions,
		ArmCalls: s.ArmCalls + o.ArmCalls, WaitCalls: s.WaitCalls + o.WaitCalls,
		ControlCalls: s.ControlCalls + o.ControlCalls,
		QPsCreated:   s.QPsCreated + o.QPsCreated, QPsDestroyed: s.QPsDestroyed + o.QPsDestroyed,
		Resets: s.Resets + o.Resets, Flushed: s.Flushed + o.Flushed,
		Executed: s.Executed + o.Executed, Bytes: s.Bytes + o.Bytes,
		Errors: s.Errors + o.Errors, Dropped: s.Dropped + o.Dropped,
	}
}

// Stats returns the device's counters.
func (d *Device) Stats() Stats {
	return Stats{
		PostCalls: d.st.post.Load(), PostedWRs: d.st.posted.Load(),
		PollCalls: d.st.poll.Load(), Completions: d.st.polled.Load(),
		ArmCalls: d.st.arm.Load(), WaitCalls: d.st.wait.Load(),
		ControlCalls: d.st.control.Load(),
		QPsCreated:   d.st.qpsCreated.Load(), QPsDestroyed: d.st.qpsDestroyed.Load(),
		Resets: d.st.resets.Load(), Flushed: d.st.flushed.Load(),
		Executed: d.st.executed.Load(), Bytes: d.st.bytes.Load(),
		Errors: d.st.errors.Load(), Dropped: d.st.dropped.Load(),
	}
}

// Live counts the objects not closed yet.
type Live struct{ PDs, CQs, QPs, MRs int }

// Live returns the objects still open on the device.
func (d *Device) Live() Live {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Live{PDs: len(d.pds), CQs: len(d.cqs), QPs: len(d.qps), MRs: len(d.lkeys)}
}

// QPInfo describes one live QP.
type QPInfo struct {
	Num     uint32
	State   rdmadev.QPState
	DestQPN uint32
	Posted  uint64 // WRs ever posted on it
	Queued  int    // WRs not executed yet
}

// QPs lists the live QPs.
func (d *Device) QPs() []QPInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]QPInfo, 0, len(d.qps))
	for _, q := range d.qps {
		out = append(out, QPInfo{Num: q.num, State: q.state, DestQPN: q.dest.qpn, Posted: q.posted, Queued: len(q.sq)})
	}
	return out
}

// NewDevice adds a NIC to the fabric and starts its worker. Close stops
// it.
func (f *Fabric) NewDevice(name string, o Options) *Device {
	if o.MTU == 0 {
		o.MTU = rdmadev.MTU4096
	}
	if o.LinkLayer == rdmadev.LinkUnspecified {
		o.LinkLayer = rdmadev.LinkEthernet
	}
	f.mu.Lock()
	f.n++
	n := f.n
	d := &Device{
		f: f, name: name, numa: o.NUMANode, ll: o.LinkLayer, mtu: o.MTU,
		port: rdmadev.PortActive,
		pds:  make(map[*pd]struct{}), cqs: make(map[*cq]struct{}), qps: make(map[uint32]*qp),
		lkeys: make(map[uint32]*mr), rkeys: make(map[uint32]*mr),
		nextQPN: uint32(0x100 + n*0x1000), nextKey: uint32(n) << 20,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	// RoCE v2 style GID from a made-up IPv4 address 10.x.y.z.
	d.gid = rdmadev.GID{10: 0xff, 11: 0xff, 12: 10, 13: byte(n >> 16), 14: byte(n >> 8), 15: byte(n)}
	if o.LinkLayer == rdmadev.LinkInfiniBand {
		d.lid = uint16(n)
		d.gid = rdmadev.GID{0: 0xfe, 1: 0x80, 13: byte(n >> 16), 14: byte(n >> 8), 15: byte(n)}
		f.byLID[d.lid] = d
	}
	f.byGID[d.gid] = d
	f.mu.Unlock()
	go d.run()
	return d
}

func (f *Fabric) lookup(gid rdmadev.GID, lid uint16, global bool) *Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	if global {
		return f.byGID[gid]
	}
	return f.byLID[lid]
}

// Name is the device name given to NewDevice.
func (d *Device) Name() string { return d.name }

// GID is the port's GID.
func (d *Device) GID() rdmadev.GID { return d.gid }

func (d *Device) portInfo() rdmadev.PortInfo {
	return rdmadev.PortInfo{Num: 1, State: d.port, LID: d.lid, LinkLayer: d.ll, ActiveMTU: d.mtu, MaxMTU: rdmadev.MTU4096, GIDIndex: 0, GID: d.gid}
}

// Info implements rdmadev.Device.
func (d *Device) Info() rdmadev.DeviceInfo {
	d.st.control.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	return rdmadev.DeviceInfo{Name: d.name, NUMANode: d.numa, Ports: []rdmadev.PortInfo{d.portInfo()}}
}

// QueryPort implements rdmadev.Device.
func (d *Device) QueryPort(port uint8) (rdmadev.PortInfo, error) {
	d.st.control.Add(1)
	if port != 1 {
		return rdmadev.PortInfo{}, fmt.Errorf("%w: port %d of %s", rdmadev.ErrInvalid, port, d.name)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return rdmadev.PortInfo{}, rdmadev.ErrClosed
	}
	return d.portInfo(), nil
}

// SetPortState changes the port state, as a link going down or up. While
// either end's port is not ACTIVE, work requests between them fail with
// WCRetryExcErr (the reference's "transport retry counter exceeded").
func (d *Device) SetPortState(s rdmadev.PortState) {
	d.mu.Lock()
	d.port = s
	d.mu.Unlock()
	d.kickAll()
}

// AllocPD implements rdmadev.Device.
func (d *Device) AllocPD() (rdmadev.PD, error) {
	d.st.control.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, rdmadev.ErrClosed
	}
	p := &pd{d: d}
	d.pds[p] = struct{}{}
	return p, nil
}

// CreateCQ implements rdmadev.Device.
func (d *Device) CreateCQ(depth int) (rdmadev.CQ, error) {
	d.st.control.Add(1)
	if depth <= 0 || depth > 1<<22 {
		return nil, fmt.Errorf("%w: CQ depth %d", rdmadev.ErrInvalid, depth)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, rdmadev.ErrClosed
	}
	c := &cq{d: d, depth: depth, ev: make(chan struct{}, 1), closedCh: make(chan struct{})}
	d.cqs[c] = struct{}{}
	return c, nil
}

// ErrLiveObjects reports a Close of a device whose objects were not all
// closed (they are destroyed anyway).
var ErrLiveObjects = errors.New("soft: device closed with live objects")

// Close implements rdmadev.Device: it stops the worker and removes the
// device from the fabric. Objects still open are destroyed and reported.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	live := Live{PDs: len(d.pds), CQs: len(d.cqs), QPs: len(d.qps), MRs: len(d.lkeys)}
	qps := make([]*qp, 0, len(d.qps))
	for _, q := range d.qps {
		qps = append(qps, q)
	}
	d.mu.Unlock()
	close(d.stop)
	<-d.done
	for _, q := range qps {
		q.destroy()
	}
	d.mu.Lock()
	for m := range d.lkeys {
		delete(d.lkeys, m)
	}
	clear(d.rkeys)
	for c := range d.cqs {
		c.shut()
	}
	clear(d.cqs)
	clear(d.pds)
	d.mu.Unlock()
	d.f.mu.Lock()
	delete(d.f.byGID, d.gid)
	if d.lid != 0 {
		delete(d.f.byLID, d.lid)
	}
	d.f.mu.Unlock()
	if live != (Live{}) {
		return fmt.Errorf("%w: %s: %+v", ErrLiveObjects, d.name, live)
	}
	return nil
}

// enqueue schedules q for the worker.
func (d *Device) enqueue(q *qp) {
	d.mu.Lock()
	if d.closed || q.queued || q.destroyed {
		d.mu.Unlock()
		return
	}
	q.queued = true
	d.ready = append(d.ready, q)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// kickAll schedules every QP with queued work (after faults or port
// states change).
func (d *Device) kickAll() {
	d.mu.Lock()
	qs := make([]*qp, 0, len(d.qps))
	for _, q := range d.qps {
		if len(q.sq) > 0 || q.state == rdmadev.QPError {
			qs = append(qs, q)
		}
	}
	d.mu.Unlock()
	for _, q := range qs {
		d.enqueue(q)
	}
}

func (d *Device) run() {
	defer close(d.done)
	for {
		select {
		case <-d.stop:
			return
		case <-d.wake:
		}
		for {
			select {
			case <-d.stop:
				return
			default:
			}
			d.mu.Lock()
			if len(d.ready) == 0 {
				d.mu.Unlock()
				break
			}
			q := d.ready[0]
			d.ready[0] = nil
			d.ready = d.ready[1:]
			q.queued = false
			d.mu.Unlock()
			q.process()
		}
	}
}

// pd is a protection domain.
type pd struct {
	d      *Device
	closed bool // guarded by d.mu
}

func (p *pd) RegMR(mem []byte, access rdmadev.Access) (rdmadev.MR, error) {
	d := p.d
	d.st.control.Add(1)
	if len(mem) == 0 {
		return nil, fmt.Errorf("%w: empty memory region", rdmadev.ErrInvalid)
	}
	if access&(rdmadev.AccessRemoteWrite|rdmadev.AccessRemoteAtomic) != 0 && access&rdmadev.AccessLocalWrite == 0 {
		// As ibv_reg_mr: remote write needs local write.
		return nil, fmt.Errorf("%w: remote write access without local write", rdmadev.ErrInvalid)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || p.closed {
		return nil, rdmadev.ErrClosed
	}
	d.nextKey++
	base := d.nextKey
	m := &mr{d: d, pd: p, mem: mem, addr: addrOf(mem), access: access,
		lkey: base<<8 | 0x11, rkey: base<<8 | 0x7e}
	d.lkeys[m.lkey] = m
	d.rkeys[m.rkey] = m
	return m, nil
}

func (p *pd) CreateQP(c rdmadev.CQ, caps rdmadev.QPCaps) (rdmadev.QP, error) {
	d := p.d
	d.st.control.Add(1)
	scq, ok := c.(*cq)
	if !ok || scq.d != d {
		return nil, fmt.Errorf("%w: CQ of another device", rdmadev.ErrInvalid)
	}
	if caps.MaxSendWR <= 0 || caps.MaxSendWR > 1<<15 || caps.MaxSendSGE < 1 || caps.MaxSendSGE > 32 {
		return nil, fmt.Errorf("%w: QP caps %+v", rdmadev.ErrInvalid, caps)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || p.closed {
		return nil, rdmadev.ErrClosed
	}
	d.nextQPN++
	q := &qp{d: d, pd: p, cq: scq, num: d.nextQPN & 0xffffff, caps: caps, state: rdmadev.QPReset}
	d.qps[q.num] = q
	d.st.qpsCreated.Add(1)
	return q, nil
}

func (p *pd) Close() error {
	d := p.d
	d.st.control.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.closed {
		return rdmadev.ErrClosed
	}
	for _, m := range d.lkeys {
		if m.pd == p {
			return fmt.Errorf("%w: PD has registered memory (EBUSY)", rdmadev.ErrInvalid)
		}
	}
	for _, q := range d.qps {
		if q.pd == p {
			return fmt.Errorf("%w: PD has QPs (EBUSY)", rdmadev.ErrInvalid)
		}
	}
	p.closed = true
	delete(d.pds, p)
	return nil
}

// mr is a registered region. dma is held (read) while the worker copies
// from or to it, so Close returns only once no copy touches it.
type mr struct {
	d          *Device
	pd         *pd
	mem        []byte
	addr       uint64
	access     rdmadev.Access
	lkey, rkey uint32

	dma  sync.RWMutex
	dead bool // guarded by dma
}

func (m *mr) LKey() uint32 { return m.lkey }
func (m *mr) RKey() uint32 { return m.rkey }

func (m *mr) Close() error {
	d := m.d
	d.st.control.Add(1)
	d.mu.Lock()
	if d.lkeys[m.lkey] != m {
		d.mu.Unlock()
		return rdmadev.ErrClosed
	}
	delete(d.lkeys, m.lkey)
	delete(d.rkeys, m.rkey)
	d.mu.Unlock()
	m.dma.Lock()
	m.dead = true
	m.dma.Unlock()
	return nil
}

// span returns the registered bytes [addr, addr+n), or false when the
// range leaves the region.
func (m *mr) span(addr uint64, n uint32) ([]byte, bool) {
	if addr < m.addr || addr-m.addr > uint64(len(m.mem)) || uint64(len(m.mem))-(addr-m.addr) < uint64(n) {
		return nil, false
	}
	off := addr - m.addr
	return m.mem[off : off+uint64(n)], true
}

// cq is a completion queue; a full queue overruns (and stays broken), as
// on hardware.
type cq struct {
	d        *Device
	mu       sync.Mutex
	buf      []rdmadev.Completion
	depth    int
	overrun  bool
	armed    bool
	closed   bool
	ev       chan struct{}
	closedCh chan struct{}
}

func (c *cq) push(wcs []rdmadev.Completion) {
	if len(wcs) == 0 {
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if len(c.buf)+len(wcs) > c.depth {
		c.overrun = true
	}
	c.buf = append(c.buf, wcs...)
	fire := c.armed
	c.armed = false
	c.mu.Unlock()
	if fire {
		select {
		case c.ev <- struct{}{}:
		default:
		}
	}
}

func (c *cq) Poll(out []rdmadev.Completion) (int, error) {
	c.d.st.poll.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, rdmadev.ErrClosed
	}
	if c.overrun {
		return 0, rdmadev.ErrCQOverrun
	}
	n := copy(out, c.buf)
	c.buf = c.buf[:copy(c.buf, c.buf[n:])]
	c.d.st.polled.Add(uint64(n))
	return n, nil
}

func (c *cq) Arm() error {
	c.d.st.arm.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return rdmadev.ErrClosed
	}
	c.armed = true
	return nil
}

func (c *cq) Wait(ctx context.Context) error {
	c.d.st.wait.Add(1)
	select {
	case <-c.ev:
		return nil
	case <-c.closedCh:
		return rdmadev.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *cq) shut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.closedCh)
	}
}

func (c *cq) Close() error {
	d := c.d
	d.st.control.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.cqs[c]; !ok {
		return rdmadev.ErrClosed
	}
	for _, q := range d.qps {
		if q.cq == c {
			return fmt.Errorf("%w: CQ has QPs (EBUSY)", rdmadev.ErrInvalid)
		}
	}
	delete(d.cqs, c)
	c.shut()
	return nil
}

// now is time.Now, for the worker's delay handling.
var now = time.Now
