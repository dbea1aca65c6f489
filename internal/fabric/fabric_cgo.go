//go:build cgo && fabric

package fabric

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#cgo noescape cf_progress
#cgo nocallback cf_progress
#cgo noescape cf_av_insert
#cgo nocallback cf_av_insert
#cgo nocallback cf_cancel
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"
)

// Built reports whether this build has the libfabric code (tag fabric,
// cgo on).
const Built = true

var lib struct {
	mu   sync.Mutex
	path string // the loaded library, "" before the first success
}

// Load opens libfabric (once per process). path "" tries $MC_LIBFABRIC_PATH,
// else DefaultLibraries in order. The error wraps ErrNotSupported when no
// library can be opened.
func Load(path string) error {
	candidates := []string{path}
	if path == "" {
		if p := os.Getenv(EnvLibrary); p != "" {
			candidates = []string{p}
		} else {
			candidates = DefaultLibraries
		}
	}
	errBuf := (*C.char)(C.malloc(C.CF_ERRLEN))
	defer C.free(unsafe.Pointer(errBuf))
	lib.mu.Lock()
	defer lib.mu.Unlock()
	if lib.path != "" {
		if path == "" || path == lib.path {
			return nil
		}
		cp := C.CString(path)
		stats.calls.Add(1)
		rc := C.cf_probe(cp, errBuf, C.CF_ERRLEN)
		C.free(unsafe.Pointer(cp))
		if rc != 0 {
			return fmt.Errorf("%w: cannot load libfabric: %s", ErrNotSupported, C.GoString(errBuf))
		}
		return fmt.Errorf("%w: libfabric is already loaded from %s; cannot also load %s", ErrNotSupported, lib.path, path)
	}
	var tried []string
	for _, p := range candidates {
		cp := C.CString(p)
		stats.calls.Add(1)
		rc := C.cf_load(cp, errBuf, C.CF_ERRLEN)
		C.free(unsafe.Pointer(cp))
		if rc == 0 {
			lib.path = p
			return nil
		}
		tried = append(tried, C.GoString(errBuf))
	}
	return fmt.Errorf("%w: cannot load libfabric (install libfabric1, or set %s): %s", ErrNotSupported, EnvLibrary, strings.Join(tried, "; "))
}

// Version is the loaded library's version ("1.17"), "" before Load.
func Version() string {
	stats.calls.Add(1)
	v := uint32(C.cf_lib_version())
	if v == 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", v>>16, v&0xffff)
}

func cErr(buf *C.char) string { return C.GoString(buf) }

// Discover lists the domains of provider (a libfabric provider name such
// as "efa" or "tcp;ofi_rxm"; "" = every provider) that offer RDM endpoints
// with RMA, one Info per domain. txSize, when positive, is the transmit
// depth asked for. Load must have succeeded.
func Discover(provider string, txSize int) ([]Info, error) {
	if err := Load(""); err != nil {
		return nil, err
	}
	const max = 64
	out := (*C.cf_dominfo)(C.calloc(max, C.sizeof_cf_dominfo))
	defer C.free(unsafe.Pointer(out))
	errBuf := (*C.char)(C.malloc(C.CF_ERRLEN))
	defer C.free(unsafe.Pointer(errBuf))
	cp := C.CString(provider)
	defer C.free(unsafe.Pointer(cp))
	var n C.int
	delivery := true
	stats.calls.Add(1)
	rc := C.cf_discover(cp, C.uint64_t(max0(txSize)), 1, out, max, &n, errBuf, C.CF_ERRLEN)
	if rc == -C.FI_ENODATA {
		// Some providers cannot promise delivery completion: take their
		// default completion semantics.
		delivery = false
		stats.calls.Add(1)
		rc = C.cf_discover(cp, C.uint64_t(max0(txSize)), 0, out, max, &n, errBuf, C.CF_ERRLEN)
	}
	if rc != 0 {
		if rc == -C.FI_ENODATA {
			if provider == "" {
				return nil, ErrNoProvider
			}
			return nil, fmt.Errorf("%w: provider %q", ErrNoProvider, provider)
		}
		return nil, fmt.Errorf("fabric: %s: %w", cErr(errBuf), Errno(-rc))
	}
	infos := make([]Info, 0, int(n))
	for _, d := range unsafe.Slice(out, int(n)) {
		infos = append(infos, Info{
			Provider:         C.GoString(&d.prov[0]),
			Fabric:           C.GoString(&d.fabric[0]),
			Domain:           C.GoString(&d.domain[0]),
			MRMode:           MRMode(d.mr_mode),
			MaxMsgSize:       uint64(d.max_msg),
			TxSize:           int(d.tx_size),
			RxSize:           int(d.rx_size),
			Progress:         Progress(d.progress),
			Loopback:         d.loopback != 0,
			AddrFormat:       int(d.addr_format),
			SrcAddr:          C.GoBytes(unsafe.Pointer(&d.src[0]), d.src_len),
			DeliveryComplete: delivery,
		})
	}
	return infos, nil
}

func max0(n int) int { return max(n, 0) }

// Endpoint is one domain (NIC) opened for RMA: fabric, domain, address
// vector, completion queue and one RDM endpoint. Its methods are safe for
// concurrent use; they are serialised (the domain is opened with
// FI_THREAD_DOMAIN).
type Endpoint struct {
	mu    sync.Mutex
	c     *C.cf_ep
	info  Info
	opts  Options
	name  []byte
	cops  []C.cf_op
	ccomp []C.cf_comp
	comps []Completion
	mrs   map[*MR]struct{}
}

// MR is a memory registration on one endpoint's domain.
type MR struct {
	ep   *Endpoint
	mr   *C.struct_fid_mr
	desc unsafe.Pointer // fi_mr_desc, C memory
	key  uint64
	mem  []byte
}

// Open opens info's domain with one endpoint.
func Open(info Info, o Options) (*Endpoint, error) {
	if err := Load(""); err != nil {
		return nil, err
	}
	o.setDefaults(info)
	co := C.cf_opts{
		tx_size:  C.uint64_t(max0(o.TxSize)),
		cq_size:  C.uint64_t(o.Slots + o.MaxCompletions),
		nslots:   C.uint32_t(o.Slots),
		maxops:   C.uint32_t(o.MaxBatch),
		maxcomps: C.uint32_t(o.MaxCompletions),
		av_count: C.uint32_t(o.AVCount),
	}
	if o.WaitFD {
		co.wait_fd = 1
	}
	if info.DeliveryComplete {
		co.delivery = 1
	}
	cprov, cdom := C.CString(info.Provider), C.CString(info.Domain)
	defer C.free(unsafe.Pointer(cprov))
	defer C.free(unsafe.Pointer(cdom))
	errBuf := (*C.char)(C.malloc(C.CF_ERRLEN))
	defer C.free(unsafe.Pointer(errBuf))
	var c *C.cf_ep
	stats.calls.Add(1)
	if rc := C.cf_open(cprov, cdom, &co, &c, errBuf, C.CF_ERRLEN); rc != 0 {
		return nil, fmt.Errorf("fabric: open %s/%s: %s: %w", info.Provider, info.Domain, cErr(errBuf), Errno(-rc))
	}
	e := &Endpoint{c: c, info: info, opts: o, mrs: make(map[*MR]struct{})}
	e.cops = unsafe.Slice(c.ops, o.MaxBatch)
	e.ccomp = unsafe.Slice(c.comps, o.MaxCompletions)
	e.comps = make([]Completion, o.MaxCompletions)
	e.name = C.GoBytes(unsafe.Pointer(&c.name[0]), C.int(c.namelen))
	return e, nil
}

// Info is the domain's description.
func (e *Endpoint) Info() Info { return e.info }

// Name is the endpoint's address, for peers' address vectors.
func (e *Endpoint) Name() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]byte(nil), e.name...)
}

// Slots is the number of operations that may be in flight at once; an
// Op's Slot must be below it.
func (e *Endpoint) Slots() int { return e.opts.Slots }

// MaxBatch is the most operations one Progress call posts.
func (e *Endpoint) MaxBatch() int { return e.opts.MaxBatch }

// WaitFD is the completion queue's wait fd (-1 when it has none). It is
// readable when the provider has something to progress; call Progress
// with wantWait and wait only when Result.MayWait is set. The fd belongs
// to the endpoint.
func (e *Endpoint) WaitFD() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c == nil {
		return -1
	}
	return int(e.c.wait_fd)
}

// RegisterMR registers mem (which must stay mapped until the MR is
// closed) for local use and remote read and write. key is the key asked
// for when the provider lets the application choose (no FI_MR_PROV_KEY);
// MR.Key is the key peers must use.
func (e *Endpoint) RegisterMR(mem []byte, key uint64) (*MR, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("fabric: register: empty buffer")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c == nil {
		return nil, ErrClosed
	}
	var mr *C.struct_fid_mr
	var outKey C.uint64_t
	var desc unsafe.Pointer
	stats.calls.Add(1)
	rc := C.cf_mr_reg(e.c, C.uint64_t(addrOf(mem)), C.uint64_t(len(mem)), C.uint64_t(key), &mr, &outKey, &desc)
	if rc != 0 {
		return nil, fmt.Errorf("fabric: fi_mr_reg %d bytes on %s: %w", len(mem), e.info.Domain, Errno(-rc))
	}
	stats.mrs.Add(1)
	m := &MR{ep: e, mr: mr, desc: desc, key: uint64(outKey), mem: mem}
	e.mrs[m] = struct{}{}
	return m, nil
}

// Key is the remote key of the registration.
func (m *MR) Key() uint64 { return m.key }

// Close deregisters the memory: peers' operations on it fail from now
// on.
func (m *MR) Close() error {
	e := m.ep
	e.mu.Lock()
	defer e.mu.Unlock()
	if m.mr == nil {
		return nil
	}
	delete(e.mrs, m)
	stats.calls.Add(1)
	rc := C.cf_mr_close(m.mr)
	m.mr, m.desc = nil, nil
	if rc != 0 {
		return fmt.Errorf("fabric: close MR: %w", Errno(-rc))
	}
	return nil
}

// Insert adds a peer's endpoint address (its Name) to the address vector.
func (e *Endpoint) Insert(addr []byte) (Addr, error) {
	if len(addr) == 0 {
		return 0, fmt.Errorf("fabric: insert: empty address")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c == nil {
		return 0, ErrClosed
	}
	var out C.uint64_t
	stats.calls.Add(1)
	if rc := C.cf_av_insert(e.c, unsafe.Pointer(&addr[0]), C.size_t(len(addr)), &out); rc != 0 {
		return 0, fmt.Errorf("fabric: fi_av_insert of a %d-byte address: %w", len(addr), Errno(-rc))
	}
	stats.avInserts.Add(1)
	return Addr(out), nil
}

// Remove drops a peer from the address vector. No operation to it may be
// in flight.
func (e *Endpoint) Remove(a Addr) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c == nil {
		return ErrClosed
	}
	stats.calls.Add(1)
	if rc := C.cf_av_remove(e.c, C.uint64_t(a)); rc != 0 {
		return fmt.Errorf("fabric: fi_av_remove: %w", Errno(-rc))
	}
	return nil
}

// Cancel asks the provider to cancel the operation in slot. Providers that
// cannot cancel RMA return an error; a canceled operation completes with
// ECANCELED.
func (e *Endpoint) Cancel(slot uint32) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c == nil {
		return ErrClosed
	}
	stats.calls.Add(1)
	if rc := C.cf_cancel(e.c, C.uint32_t(slot)); rc != 0 {
		return Errno(-rc)
	}
	return nil
}

// Progress is the hot path, one crossing into C: it posts ops (up to
// MaxBatch; all but the last with FI_MORE), retrying a bounded number of
// times with progress in between when the provider's queue is full, then
// reads up to MaxCompletions completions. With wantWait, when nothing was
// posted or completed, it asks fi_trywait whether the wait fd may be
// waited on. The completions slice is valid until the next call.
func (e *Endpoint) Progress(ops []Op, wantWait bool) (Result, []Completion, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c == nil {
		return Result{}, nil, ErrClosed
	}
	n := min(len(ops), len(e.cops))
	for i := 0; i < n; i++ {
		op, c := &ops[i], &e.cops[i]
		c.local = C.uint64_t(addrOf(op.Local))
		c.len = C.uint64_t(len(op.Local))
		c.desc = nil
		if op.MR != nil {
			c.desc = op.MR.desc
		}
		c.peer = C.uint64_t(op.Peer)
		c.remote = C.uint64_t(op.Remote)
		c.key = C.uint64_t(op.Key)
		c.slot = C.uint32_t(op.Slot)
		c.write = 0
		if op.Write {
			c.write = 1
		}
	}
	var r C.cf_result
	ww := C.int(0)
	if wantWait {
		ww = 1
	}
	stats.calls.Add(1)
	stats.progress.Add(1)
	if n > 0 {
		stats.postCalls.Add(1)
	}
	C.cf_progress(e.c, C.int(n), ww, &r)
	res := Result{Attempted: int(r.attempted), Posted: int(r.posted), EAGAIN: int(r.eagain), MayWait: r.may_wait != 0}
	for i := 0; i < res.Attempted; i++ {
		ops[i].Err = nil
		if rc := e.cops[i].rc; rc != 0 {
			ops[i].Err = Errno(-rc)
		}
	}
	nc := int(r.ncomp)
	comps := e.comps[:nc]
	for i := range comps {
		c := &e.ccomp[i]
		comps[i] = Completion{Slot: uint32(c.slot)}
		if c.err != 0 {
			comps[i].Err = &CQError{Errno: Errno(c.err), ProvErrno: int(c.prov_errno), ProvMsg: C.GoString(&c.msg[0])}
		}
	}
	stats.posted.Add(uint64(res.Posted))
	stats.completions.Add(uint64(nc))
	stats.eagain.Add(uint64(res.EAGAIN))
	var err error
	if r.err != 0 {
		err = fmt.Errorf("fabric: fi_cq_read on %s: %w", e.info.Domain, Errno(-r.err))
	}
	return res, comps, err
}

// Reset closes the endpoint and opens a new one on the same domain,
// address vector and completion queue: operations still posted are
// dropped by the provider, which no longer touches their buffers. It
// returns the completions that were already queued (process them before
// reusing their slots). The endpoint's Name changes; peers must learn it
// again. If reopening fails the endpoint posts nothing until Close.
func (e *Endpoint) Reset() ([]Completion, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c == nil {
		return nil, ErrClosed
	}
	if e.info.MRMode&MREndpoint != 0 {
		return nil, ErrNoReset
	}
	stats.calls.Add(1)
	C.cf_ep_close(e.c)
	var out []Completion
	for {
		var r C.cf_result
		stats.calls.Add(1)
		C.cf_progress(e.c, 0, 0, &r)
		nc := int(r.ncomp)
		if nc == 0 {
			break
		}
		for i := 0; i < nc; i++ {
			c := &e.ccomp[i]
			comp := Completion{Slot: uint32(c.slot)}
			if c.err != 0 {
				comp.Err = &CQError{Errno: Errno(c.err), ProvErrno: int(c.prov_errno), ProvMsg: C.GoString(&c.msg[0])}
			}
			out = append(out, comp)
		}
	}
	errBuf := (*C.char)(C.malloc(C.CF_ERRLEN))
	defer C.free(unsafe.Pointer(errBuf))
	stats.calls.Add(1)
	if rc := C.cf_ep_open(e.c, errBuf, C.CF_ERRLEN); rc != 0 {
		return out, fmt.Errorf("fabric: reopen endpoint on %s: %s: %w", e.info.Domain, cErr(errBuf), Errno(-rc))
	}
	e.name = C.GoBytes(unsafe.Pointer(&e.c.name[0]), C.int(e.c.namelen))
	return out, nil
}

// Close releases everything, in order: the endpoint, the registrations
// still open, the completion queue, the address vector, the domain and
// the fabric.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.c == nil {
		return nil
	}
	stats.calls.Add(1)
	rc := C.cf_ep_close(e.c)
	for m := range e.mrs {
		stats.calls.Add(1)
		C.cf_mr_close(m.mr)
		m.mr, m.desc = nil, nil
	}
	clear(e.mrs)
	stats.calls.Add(1)
	C.cf_close(e.c)
	e.c = nil
	e.cops, e.ccomp = nil, nil
	if rc != 0 {
		return fmt.Errorf("fabric: close endpoint: %w", Errno(-rc))
	}
	return nil
}

func addrOf(b []byte) uint64 {
	if cap(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}
