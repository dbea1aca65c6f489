//go:build cgo && verbs

package verbs

/*
#cgo LDFLAGS: -ldl
#cgo noescape cv_post
#cgo nocallback cv_post
#cgo noescape cv_poll
#cgo nocallback cv_poll
#cgo noescape cv_arm
#cgo nocallback cv_arm
#cgo noescape cv_get_event
#cgo nocallback cv_get_event
#include "shim.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

// Library is a dlopen'ed libibverbs.
type Library struct {
	name string
	mu   sync.Mutex
	c    *C.cv_lib
	open int // devices not closed yet
}

// Load opens libibverbs (DefaultLibrary when name is "") with
// RTLD_NOW|RTLD_LOCAL and resolves the calls this package makes. A host
// without the library gets an error matching ErrUnavailable.
func Load(name string) (*Library, error) {
	if name == "" {
		name = DefaultLibrary
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	const errLen = 512
	errBuf := (*C.char)(C.malloc(errLen))
	defer C.free(unsafe.Pointer(errBuf))
	crossings.control.Add(1)
	c := C.cv_load(cname, errBuf, errLen)
	if c == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, C.GoString(errBuf))
	}
	return &Library{name: name, c: c}, nil
}

// Name is the file the library was loaded from.
func (l *Library) Name() string { return l.name }

// Close unloads the library; devices opened from it must be closed
// first.
func (l *Library) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		return nil
	}
	if l.open > 0 {
		return fmt.Errorf("verbs: %d devices still open", l.open)
	}
	crossings.control.Add(1)
	C.cv_unload(l.c)
	l.c = nil
	return nil
}

func errno(rc C.int) error {
	if rc < 0 {
		rc = -rc
	}
	return unix.Errno(rc)
}

// Devices opens every usable RDMA device: those libibverbs lists, with
// the IB transport (InfiniBand or RoCE; iWARP and EFA devices have no RC
// READ/WRITE path here), filtered by o.Names. A host without devices
// gets an error matching ErrNoDevices.
func (l *Library) Devices(o Options) ([]rdmadev.Device, error) {
	if o.SysfsRoot == "" {
		o.SysfsRoot = "/sys"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		return nil, rdmadev.ErrClosed
	}
	var list **C.struct_ibv_device
	crossings.control.Add(1)
	n := int(C.cv_device_list(l.c, &list))
	if n < 0 {
		e := errno(C.int(n))
		if e == unix.ENOSYS {
			return nil, fmt.Errorf("%w: ibv_get_device_list: no kernel RDMA support: %w", ErrNoDevices, e)
		}
		return nil, fmt.Errorf("%w: ibv_get_device_list: %w", ErrNoDevices, e)
	}
	defer func() {
		crossings.control.Add(1)
		C.cv_free_device_list(l.c, list)
	}()
	if n == 0 {
		return nil, fmt.Errorf("%w (ibv_get_device_list found none)", ErrNoDevices)
	}
	var devs []rdmadev.Device
	var skipped []string
	for i := 0; i < n; i++ {
		crossings.control.Add(2)
		name := C.GoString(C.cv_device_name(l.c, list, C.int(i)))
		if len(o.Names) > 0 && !slices.Contains(o.Names, name) {
			continue
		}
		if tt := C.cv_device_transport(list, C.int(i)); tt != C.IBV_TRANSPORT_IB {
			skipped = append(skipped, name+": not an InfiniBand/RoCE device")
			continue
		}
		var cerr C.int
		crossings.control.Add(1)
		ctx := C.cv_open_device(l.c, list, C.int(i), &cerr)
		if ctx == nil {
			skipped = append(skipped, fmt.Sprintf("%s: ibv_open_device: %v", name, errno(cerr)))
			continue
		}
		d, err := l.newDevice(name, ctx, o)
		if err != nil {
			crossings.control.Add(1)
			C.cv_close_device(l.c, ctx)
			skipped = append(skipped, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		l.open++
		devs = append(devs, d)
	}
	if len(devs) == 0 {
		if len(skipped) == 0 {
			return nil, fmt.Errorf("%w (none named %v)", ErrNoDevices, o.Names)
		}
		return nil, fmt.Errorf("%w (%s)", ErrNoDevices, strings.Join(skipped, "; "))
	}
	return devs, nil
}

// device is one opened NIC (an ibv_context).
type device struct {
	lib   *Library
	ctx   *C.struct_ibv_context
	sysfs string
	attr  C.cv_devattr
	info  rdmadev.DeviceInfo

	mu     sync.Mutex
	closed bool
}

func (l *Library) newDevice(name string, ctx *C.struct_ibv_context, o Options) (*device, error) {
	d := &device{lib: l, ctx: ctx, sysfs: o.SysfsRoot}
	crossings.control.Add(1)
	if rc := C.cv_query_device(l.c, ctx, &d.attr); rc != 0 {
		return nil, fmt.Errorf("ibv_query_device: %w", errno(rc))
	}
	d.info = rdmadev.DeviceInfo{Name: name, NUMANode: NUMANode(o.SysfsRoot, name)}
	for p := 1; p <= int(d.attr.ports); p++ {
		if o.Port != 0 && uint8(p) != o.Port {
			continue
		}
		pi, gtl, err := d.queryPort(uint8(p))
		if err != nil {
			return nil, err
		}
		var entries []GIDEntry
		for idx := 0; idx < min(gtl, 256); idx++ {
			if o.GIDIndex > 0 && idx != o.GIDIndex {
				continue
			}
			var g rdmadev.GID
			crossings.control.Add(1)
			if C.cv_query_gid(l.c, ctx, C.uint8_t(p), C.int(idx), (*C.uint8_t)(unsafe.Pointer(&g[0]))) != 0 {
				continue
			}
			entries = append(entries, GIDEntry{Index: idx, GID: g, Type: gidType(o.SysfsRoot, name, uint8(p), idx)})
		}
		if i := ChooseGID(pi.LinkLayer, entries); i >= 0 {
			for _, e := range entries {
				if e.Index == i {
					pi.GIDIndex, pi.GID = i, e.GID
				}
			}
		}
		d.info.Ports = append(d.info.Ports, pi)
	}
	if len(d.info.Ports) == 0 {
		return nil, fmt.Errorf("no port %d", o.Port)
	}
	return d, nil
}

func (d *device) queryPort(p uint8) (rdmadev.PortInfo, int, error) {
	var cp C.cv_port
	crossings.control.Add(1)
	if rc := C.cv_query_port(d.lib.c, d.ctx, C.uint8_t(p), &cp); rc != 0 {
		return rdmadev.PortInfo{}, 0, fmt.Errorf("ibv_query_port(%d): %w", p, errno(rc))
	}
	return rdmadev.PortInfo{
		Num: p, State: rdmadev.PortState(cp.state), LID: uint16(cp.lid), LinkLayer: rdmadev.LinkLayer(cp.link_layer),
		ActiveMTU: rdmadev.MTUFromEnum(int(cp.active_mtu)), MaxMTU: rdmadev.MTUFromEnum(int(cp.max_mtu)), GIDIndex: -1,
	}, int(cp.gid_tbl_len), nil
}

func (d *device) Info() rdmadev.DeviceInfo {
	info := d.info
	info.Ports = slices.Clone(d.info.Ports)
	return info
}

// QueryPort reads the port's state again; the GID is the one chosen at
// discovery.
func (d *device) QueryPort(port uint8) (rdmadev.PortInfo, error) {
	if err := d.live(); err != nil {
		return rdmadev.PortInfo{}, err
	}
	pi, _, err := d.queryPort(port)
	if err != nil {
		return pi, fmt.Errorf("verbs: %s: %w", d.info.Name, err)
	}
	for _, known := range d.info.Ports {
		if known.Num == port {
			pi.GIDIndex, pi.GID = known.GIDIndex, known.GID
		}
	}
	return pi, nil
}

func (d *device) live() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return rdmadev.ErrClosed
	}
	return nil
}

func (d *device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	crossings.control.Add(1)
	if rc := C.cv_close_device(d.lib.c, d.ctx); rc != 0 {
		return fmt.Errorf("verbs: ibv_close_device(%s): %w", d.info.Name, errno(rc))
	}
	d.lib.mu.Lock()
	d.lib.open--
	d.lib.mu.Unlock()
	return nil
}

func (d *device) AllocPD() (rdmadev.PD, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	var cerr C.int
	crossings.control.Add(1)
	p := C.cv_alloc_pd(d.lib.c, d.ctx, &cerr)
	if p == nil {
		return nil, fmt.Errorf("verbs: ibv_alloc_pd(%s): %w", d.info.Name, errno(cerr))
	}
	return &pd{d: d, c: p}, nil
}

// pollCap is the size of each CQ's C-side completion arrays: the most
// completions one Poll returns.
const pollCap = 256

func (d *device) CreateCQ(depth int) (rdmadev.CQ, error) {
	if err := d.live(); err != nil {
		return nil, err
	}
	if depth <= 0 || d.attr.max_cqe > 0 && depth > int(d.attr.max_cqe) {
		return nil, fmt.Errorf("%w: CQ depth %d (device max %d)", rdmadev.ErrInvalid, depth, d.attr.max_cqe)
	}
	var cerr C.int
	crossings.control.Add(1)
	c := C.cv_create_cq(d.lib.c, d.ctx, C.int(depth), pollCap, &cerr)
	if c == nil {
		return nil, fmt.Errorf("verbs: ibv_create_cq(%s, %d): %w", d.info.Name, depth, errno(cerr))
	}
	q, err := newCQ(d.lib, c)
	if err != nil {
		C.cv_destroy_cq(d.lib.c, c)
		return nil, err
	}
	q.d = d
	return q, nil
}

// pd is a protection domain.
type pd struct {
	d *device
	c *C.struct_ibv_pd
}

func (p *pd) RegMR(mem []byte, access rdmadev.Access) (rdmadev.MR, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("%w: empty memory region", rdmadev.ErrInvalid)
	}
	// The address goes over as an integer: registered memory is mapped
	// outside the Go heap, and C keeps no Go pointer.
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	var cerr C.int
	crossings.control.Add(1)
	m := C.cv_reg_mr(p.d.lib.c, p.c, C.uintptr_t(addr), C.size_t(len(mem)), C.int(access), &cerr)
	if m == nil {
		return nil, fmt.Errorf("verbs: ibv_reg_mr(%s, %#x+%d): %w", p.d.info.Name, addr, len(mem), errno(cerr))
	}
	return &mr{d: p.d, c: m, lkey: uint32(C.cv_mr_lkey(m)), rkey: uint32(C.cv_mr_rkey(m))}, nil
}

func (p *pd) CreateQP(c rdmadev.CQ, caps rdmadev.QPCaps) (rdmadev.QP, error) {
	vc, ok := c.(*cq)
	if !ok || vc.d != p.d {
		return nil, fmt.Errorf("%w: CQ of another device", rdmadev.ErrInvalid)
	}
	if caps.MaxSendWR <= 0 {
		return nil, fmt.Errorf("%w: max_send_wr %d", rdmadev.ErrInvalid, caps.MaxSendWR)
	}
	var cerr C.int
	crossings.control.Add(1)
	q := C.cv_create_qp(p.d.lib.c, p.c, vc.c.cq, C.int(caps.MaxSendWR), C.int(caps.MaxRecvWR), C.int(caps.MaxSendSGE),
		C.int(caps.MaxRecvSGE), C.int(caps.MaxInline), &cerr)
	if q == nil {
		return nil, fmt.Errorf("verbs: ibv_create_qp(%s): %w", p.d.info.Name, errno(cerr))
	}
	return newQP(p.d.lib, p.d, q), nil
}

func (p *pd) Close() error {
	crossings.control.Add(1)
	if rc := C.cv_dealloc_pd(p.d.lib.c, p.c); rc != 0 {
		return fmt.Errorf("verbs: ibv_dealloc_pd(%s): %w", p.d.info.Name, errno(rc))
	}
	return nil
}

// mr is a registered memory region.
type mr struct {
	d          *device
	c          *C.struct_ibv_mr
	lkey, rkey uint32
	once       sync.Once
}

func (m *mr) LKey() uint32 { return m.lkey }
func (m *mr) RKey() uint32 { return m.rkey }

func (m *mr) Close() error {
	err := rdmadev.ErrClosed
	m.once.Do(func() {
		crossings.control.Add(1)
		if rc := C.cv_dereg_mr(m.d.lib.c, m.c); rc != 0 {
			err = fmt.Errorf("verbs: ibv_dereg_mr: %w", errno(rc))
			return
		}
		err = nil
	})
	return err
}

// cq is a completion queue with its completion channel. The channel fd
// is non-blocking and registered with the Go netpoller (through a
// duplicate descriptor), so Wait parks the goroutine, never a thread in
// C.
type cq struct {
	lib *Library
	d   *device
	c   *C.cv_cq
	f   *os.File
	raw syscall.RawConn

	mu  sync.Mutex // guards the C completion array
	out []C.cv_wc
}

func newCQ(l *Library, c *C.cv_cq) (*cq, error) {
	fd, err := unix.FcntlInt(uintptr(C.cv_cq_fd(c)), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("verbs: dup completion channel: %w", err)
	}
	// O_NONBLOCK lives on the shared file description: the C side set it.
	f := os.NewFile(uintptr(fd), "ibv-comp-channel")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("verbs: completion channel: %w", err)
	}
	return &cq{lib: l, c: c, f: f, raw: raw, out: unsafe.Slice(c.out, int(c.cap))}, nil
}

func (q *cq) Poll(out []rdmadev.Completion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(len(out), len(q.out))
	crossings.poll.Add(1)
	k := int(C.cv_poll(q.c, C.int(n)))
	if k < 0 {
		return 0, fmt.Errorf("verbs: ibv_poll_cq failed (%d): %w", k, rdmadev.ErrCQOverrun)
	}
	for i, w := range q.out[:k] {
		out[i] = rdmadev.Completion{ID: uint64(w.wr_id), Status: rdmadev.WCStatus(w.status), Op: wcOpcode(uint32(w.opcode)),
			Bytes: uint32(w.byte_len), QPN: uint32(w.qp_num), VendorErr: uint32(w.vendor_err)}
	}
	return k, nil
}

func (q *cq) Arm() error {
	crossings.arm.Add(1)
	if rc := C.cv_arm(q.c); rc != 0 {
		return fmt.Errorf("verbs: ibv_req_notify_cq: %w", errno(rc))
	}
	return nil
}

// Wait waits in the netpoller until the channel fd is readable, then
// takes the event (ibv_get_cq_event on a non-blocking fd) and acks it.
func (q *cq) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		q.f.SetReadDeadline(time.Unix(1, 0))
		close(fired)
	})
	var rc C.int
	err := q.raw.Read(func(uintptr) bool {
		crossings.event.Add(1)
		rc = C.cv_get_event(q.lib.c, q.c)
		return rc != C.EAGAIN
	})
	if !stop() {
		// The cancel ran (or is running): let it finish, then clear the
		// deadline it set.
		<-fired
		q.f.SetReadDeadline(time.Time{})
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("verbs: completion channel: %w", err)
	}
	if rc != 0 {
		return fmt.Errorf("verbs: ibv_get_cq_event: %w", errno(rc))
	}
	return nil
}

func (q *cq) Close() error {
	err := q.f.Close()
	crossings.control.Add(1)
	if rc := C.cv_destroy_cq(q.lib.c, q.c); rc != 0 {
		return errors.Join(err, fmt.Errorf("verbs: ibv_destroy_cq: %w", errno(rc)))
	}
	return err
}

// qp is an RC queue pair with its C-side work request arrays.
type qp struct {
	lib *Library
	d   *device
	c   *C.cv_qp
	num uint32

	mu sync.Mutex // guards the C arrays
	in []C.cv_wr
}

func newQP(l *Library, d *device, c *C.cv_qp) *qp {
	return &qp{lib: l, d: d, c: c, num: uint32(C.cv_qp_num(c)), in: unsafe.Slice(c.in, int(c.cap))}
}

func (q *qp) Num() uint32 { return q.num }

func (q *qp) modify(what string, rc C.int) error {
	if rc != 0 {
		e := errno(rc)
		if e == unix.EINVAL {
			return fmt.Errorf("verbs: QP %#x %s: %w: %w", q.num, what, rdmadev.ErrBadState, e)
		}
		return fmt.Errorf("verbs: QP %#x %s: %w", q.num, what, e)
	}
	return nil
}

func (q *qp) ToInit(port uint8, access rdmadev.Access) error {
	crossings.control.Add(1)
	return q.modify("to INIT", C.cv_qp_init(q.lib.c, q.c, C.uint8_t(port), C.int(access)))
}

func (q *qp) ToRTR(a rdmadev.RTRAttr) error {
	if !a.PathMTU.Valid() {
		return fmt.Errorf("%w: path MTU %d", rdmadev.ErrInvalid, a.PathMTU)
	}
	var maxRd int
	if q.d != nil {
		maxRd = int(q.d.attr.max_qp_rd_atom)
	}
	global := C.int(0)
	if a.Global {
		global = 1
	}
	crossings.control.Add(1)
	return q.modify("to RTR", C.cv_qp_rtr(q.lib.c, q.c, C.uint8_t(a.Port), C.int(a.PathMTU.Enum()), C.uint32_t(a.DestQPN),
		C.uint16_t(a.DestLID), C.uint64_t(binary.BigEndian.Uint64(a.DestGID[:8])), C.uint64_t(binary.BigEndian.Uint64(a.DestGID[8:])),
		C.int(a.SGIDIndex), global, C.uint8_t(a.HopLimit), C.uint32_t(a.RQPSN), C.uint8_t(clampAtomic(a.MaxDestRdAtomic, maxRd)),
		C.uint8_t(a.MinRNRTimer)))
}

func (q *qp) ToRTS(a rdmadev.RTSAttr) error {
	var maxRd int
	if q.d != nil {
		maxRd = int(q.d.attr.max_qp_init_rd_atom)
	}
	crossings.control.Add(1)
	return q.modify("to RTS", C.cv_qp_rts(q.lib.c, q.c, C.uint8_t(a.Timeout), C.uint8_t(a.RetryCount), C.uint8_t(a.RNRRetry),
		C.uint32_t(a.SQPSN), C.uint8_t(clampAtomic(a.MaxRdAtomic, maxRd))))
}

func (q *qp) SetError() error {
	crossings.control.Add(1)
	return q.modify("to ERR", C.cv_qp_set_state(q.lib.c, q.c, C.IBV_QPS_ERR))
}

// Reset moves the QP to RESET; the HCA drops its outstanding work
// requests (no completions) once the command returns.
func (q *qp) Reset() error {
	crossings.control.Add(1)
	return q.modify("to RESET", C.cv_qp_set_state(q.lib.c, q.c, C.IBV_QPS_RESET))
}

func (q *qp) State() (rdmadev.QPState, error) {
	crossings.control.Add(1)
	if err := q.modify("query", C.cv_qp_query(q.lib.c, q.c)); err != nil {
		return 0, err
	}
	return rdmadev.QPState(q.c.state), nil
}

// PostSend writes the work requests into the QP's C array and posts them
// as one chain: one cgo crossing for the batch.
func (q *qp) PostSend(wrs []rdmadev.SendWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(len(wrs), len(q.in))
	for i, w := range wrs[:n] {
		q.in[i] = C.cv_wr{id: C.uint64_t(w.ID), local: C.uint64_t(w.Local), remote: C.uint64_t(w.Remote),
			len: C.uint32_t(w.Length), lkey: C.uint32_t(w.LKey), rkey: C.uint32_t(w.RKey), op: C.uint32_t(w.Op)}
	}
	crossings.post.Add(1)
	rc := C.cv_post(q.c, C.int(n))
	posted := int(q.c.bad)
	if rc != 0 {
		e := errno(rc)
		if e == unix.ENOMEM {
			return posted, fmt.Errorf("verbs: ibv_post_send: %w: %w", rdmadev.ErrQueueFull, e)
		}
		return posted, fmt.Errorf("verbs: ibv_post_send: %w", e)
	}
	if n < len(wrs) {
		return n, fmt.Errorf("%w: %d work requests in one post (max %d)", rdmadev.ErrQueueFull, len(wrs), len(q.in))
	}
	return n, nil
}

func (q *qp) Close() error {
	crossings.control.Add(1)
	if rc := C.cv_destroy_qp(q.lib.c, q.c); rc != 0 {
		return fmt.Errorf("verbs: ibv_destroy_qp: %w", errno(rc))
	}
	return nil
}
